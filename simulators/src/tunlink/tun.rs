//! The TUN device and the few kernel calls std does not offer: creating
//! the device (`TUNSETIFF`), giving it an address, netmask and MTU and
//! bringing it up (`SIOCSIF*`), and asking to be stopped when the parent
//! process dies (`PR_SET_PDEATHSIG`).
//!
//! This is the one module of the workspace allowed `unsafe` (see the root
//! `Cargo.toml`): each block is a single `ioctl` or `prctl` on a
//! fully initialised, zeroed C struct that lives across the call, with the
//! result checked.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// An open TUN device (IPv4 packets, no packet-information header),
/// non-blocking, registered with tokio. Closing it removes the device.
#[derive(Debug)]
pub struct TunDevice {
    fd: AsyncFd<File>,
    name: String,
}

impl TunDevice {
    /// Creates a TUN device named after `pattern` (`%d` is replaced by the
    /// kernel with the first free number, e.g. `optun%d` -> `optun0`).
    /// Needs CAP_NET_ADMIN in the current network namespace, and a tokio
    /// runtime (the device is registered with its reactor).
    pub fn create(pattern: &str) -> io::Result<TunDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")?;
        let mut request = interface_request(pattern)?;
        // TUN: IP packets; NO_PI: without the 4-byte flags/protocol prefix.
        let flags = libc::IFF_TUN | libc::IFF_NO_PI;
        request.ifr_ifru.ifru_flags = libc::c_short::try_from(flags).unwrap_or(0);
        // SAFETY: TUNSETIFF reads and writes one `ifreq`, which lives
        // across the call; the fd is open.
        let done = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut request) };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        let name: Vec<u8> =
            request.ifr_name.iter().take_while(|&&c| c != 0).map(|&c| c.to_ne_bytes()[0]).collect();
        // Only reads wait; a TUN write never does.
        // SAFETY: the `File` owns its descriptor, which stays open and the
        // same until the `AsyncFd` (which owns the `File`) is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(file, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(TunDevice { fd, name: String::from_utf8_lossy(&name).into_owned() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Gives the device `addr` with `netmask` (which routes that subnet into
    /// the device) and `mtu`, and brings it up.
    pub fn configure(&self, addr: Ipv4Addr, netmask: Ipv4Addr, mtu: u16) -> io::Result<()> {
        // Any AF_INET socket carries the interface ioctls.
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        let fd = socket.as_raw_fd();

        let mut request = interface_request(&self.name)?;
        request.ifr_ifru.ifru_addr = sockaddr(addr);
        // SAFETY: as in `create`: one `ifreq` that outlives the call.
        check(unsafe { libc::ioctl(fd, libc::SIOCSIFADDR, &mut request) })?;

        let mut request = interface_request(&self.name)?;
        request.ifr_ifru.ifru_netmask = sockaddr(netmask);
        // SAFETY: as above.
        check(unsafe { libc::ioctl(fd, libc::SIOCSIFNETMASK, &mut request) })?;

        let mut request = interface_request(&self.name)?;
        request.ifr_ifru.ifru_mtu = libc::c_int::from(mtu);
        // SAFETY: as above.
        check(unsafe { libc::ioctl(fd, libc::SIOCSIFMTU, &mut request) })?;

        let mut request = interface_request(&self.name)?;
        // SAFETY: as above; SIOCGIFFLAGS fills `ifru_flags`.
        check(unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) })?;
        // SAFETY: the kernel just wrote the flags member of the union.
        let flags = unsafe { request.ifr_ifru.ifru_flags };
        let up = libc::c_short::try_from(libc::IFF_UP | libc::IFF_RUNNING).unwrap_or(1);
        request.ifr_ifru.ifru_flags = flags | up;
        // SAFETY: as above.
        check(unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut request) })
    }

    /// Waits until a packet can be read, then reads it into `buf`: its
    /// length, or `None` when nothing was left to read after all.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut guard = self.fd.readable().await?;
        match guard.try_io(|fd| fd.get_ref().read(buf)) {
            Ok(read) => read.map(Some),
            Err(_would_block) => Ok(None),
        }
    }

    /// Reads one more packet if one is waiting, without waiting.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.fd.get_ref().read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Hands one packet to the kernel as if it had arrived on the device.
    /// A TUN write never waits: the kernel queues the packet or refuses it.
    pub fn send(&self, packet: &[u8]) -> io::Result<usize> {
        self.fd.get_ref().write(packet)
    }
}

/// An `ifreq` naming `name` (at most 15 bytes), every other byte zero.
fn interface_request(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: `ifreq` is plain C data (arrays, integers and a union of
    // them); all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= request.ifr_name.len() || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?}: 1 to 15 bytes"),
        ));
    }
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = libc::c_char::from_ne_bytes([byte]);
    }
    Ok(request)
}

/// `addr` as the generic `sockaddr` the interface ioctls take (an
/// AF_INET `sockaddr_in` laid over it: both are 16 bytes).
fn sockaddr(addr: Ipv4Addr) -> libc::sockaddr {
    let mut out = libc::sockaddr { sa_family: 0, sa_data: [0; 14] };
    out.sa_family = libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2);
    // sockaddr_in after the family: port (2 bytes, 0), then the address.
    for (slot, byte) in out.sa_data[2..6].iter_mut().zip(addr.octets()) {
        *slot = libc::c_char::from_ne_bytes([byte]);
    }
    out
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Asks the kernel to send SIGTERM when the parent process exits, so an
/// emulator whose harness crashed does not outlive it (and keep its
/// namespace alive). Strictly it fires when the parent *thread* that
/// started us exits.
pub fn terminate_with_parent() -> io::Result<()> {
    let signal = libc::c_ulong::try_from(libc::SIGTERM).unwrap_or(15);
    // SAFETY: PR_SET_PDEATHSIG takes one integer argument and touches no
    // memory of ours.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal) })
}
