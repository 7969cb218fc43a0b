//! `opgraph-sim tunlink`: the kernel-level link emulator from the command
//! line.
//!
//! Needs root (CAP_NET_ADMIN) and `/dev/net/tun`, and a network namespace
//! of its own, e.g.:
//!
//! ```sh
//! unshare -n sh -c 'ip link set lo up
//!   opgraph-sim tunlink --loss 0.02 --latency 25ms --seed 1 &
//!   sleep 1   # or wait for the `listening` lines
//!   my-server --listen 10.77.0.1:4433 & my-client --connect 10.77.1.1:4433'
//! ```
//!
//! Prints `listening local=ADDR` (where servers bind) and `listening
//! remote=ADDR` (what clients dial) on stdout once the device is up, then
//! carries packets until SIGTERM or Ctrl-C, or until its parent process
//! exits (it asks the kernel for a SIGTERM then), and prints the summary
//! ([`TunLinkStats`]'s `summary ...` lines). The device disappears with
//! the process.

use std::net::Ipv4Addr;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::packet::Hairpin;
use super::{TunLink, TunLinkConfig, TunLinkStats, tun};
use crate::error::{Error, Result};
use crate::print;
use crate::proxy::cli::LinkArgs;

/// Emulate a lossy link at the IP level, through a TUN device.
#[derive(Debug, Clone, clap::Args)]
pub struct TunLinkArgs {
    /// Loss, delay, reordering and bandwidth, per IP packet.
    #[command(flatten)]
    pub link: LinkArgs,
    /// Name of the TUN device; %d takes the first free number.
    #[arg(long, default_value = "optun%d")]
    pub device: String,
    /// The host's address on the device, where servers listen.
    #[arg(long, default_value = "10.77.0.1")]
    pub local: Ipv4Addr,
    /// The fake address clients dial to reach a server on --local.
    #[arg(long, default_value = "10.77.1.1")]
    pub remote: Ipv4Addr,
    /// The fake address servers see their clients come from.
    #[arg(long, default_value = "10.77.1.2")]
    pub mirror: Ipv4Addr,
    /// MTU of the device.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u16,
    /// Packets waiting for their release, both directions, before more are dropped.
    #[arg(long, default_value_t = 16_384)]
    pub queue_packets: usize,
    /// Add the device even in a namespace with interfaces besides lo, e.g. the host's (removed on exit).
    #[arg(long)]
    pub allow_host_namespace: bool,
}

impl TunLinkArgs {
    /// The config these arguments describe; unset options keep the
    /// defaults. Not validated yet.
    pub fn into_config(self) -> TunLinkConfig {
        // Loss is real here: the kernel's TCP retransmits by itself, so
        // the proxy's RTO plays no part.
        let (link, seed) = self.link.into_config(None);
        TunLinkConfig {
            device: self.device,
            hairpin: Hairpin { local: self.local, remote: self.remote, mirror: self.mirror },
            mtu: self.mtu,
            link,
            seed,
            queue_packets: self.queue_packets,
            allow_host_namespace: self.allow_host_namespace,
        }
    }
}

/// Runs the emulator until SIGTERM, Ctrl-C or the parent's exit; see the
/// module docs.
pub async fn run(args: TunLinkArgs) -> Result<TunLinkStats> {
    tun::terminate_with_parent().map_err(Error::io("PR_SET_PDEATHSIG"))?;
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::io("SIGTERM handler"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::io("SIGINT handler"))?;
    let config = args.into_config();
    let hairpin = config.hairpin;
    let link = TunLink::open(config)?;
    print(&format!(
        "device {}\nlistening local={}\nlistening remote={}\n",
        link.device_name(),
        hairpin.local,
        hairpin.remote
    ))?;
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        stop.cancel();
    });
    let stats = link.run(cancel).await?;
    info!("stopping");
    print(&stats.to_string())?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        link: TunLinkArgs,
    }

    fn parse(args: &[&str]) -> std::result::Result<TunLinkConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("tunlink").chain(args.iter().copied()))
            .map(|cli| cli.link.into_config())
    }

    #[test]
    fn the_documented_command_line_parses() {
        let config = parse(&["--loss", "0.02", "--latency", "25ms", "--seed", "7"]).unwrap();
        assert_eq!(config.link.loss, 0.02);
        assert_eq!(config.link.latency, std::time::Duration::from_millis(25));
        assert_eq!(config.seed, 7);
        assert_eq!(config.hairpin.remote, Ipv4Addr::new(10, 77, 1, 1));
        assert_eq!(config.mtu, 1500);
        config.validate().unwrap();
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["--latency", "soon"]).is_err());
        assert!(parse(&["--remote", "10.77.1"]).is_err());
        for args in [
            &["--loss", "1.5"][..],
            &["--remote", "10.78.1.1"],
            &["--mirror", "10.77.0.1"],
            &["--mtu", "100"],
            &["--queue-packets", "0"],
        ] {
            let config = parse(args).unwrap();
            assert!(config.validate().is_err(), "{args:?} should not validate");
        }
    }
}
