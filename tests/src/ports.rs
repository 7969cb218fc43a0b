//! Loopback ports for the servers the tests start (ClickHouse, ZooKeeper,
//! Mosquitto, the cloud in the site test).
//!
//! A port is picked by binding it and handed over when the listener is
//! closed; the server binds it a moment later. Two things may take it in
//! between, and with them the test: another pick, and an outgoing
//! connection, which the kernel gives a source port from its ephemeral
//! range. A server killed and started again on its old ports (a ClickHouse
//! replica named in its cluster's configuration) leaves the port open to
//! both for the whole restart. So ports are picked below the ephemeral
//! range, where the kernel never puts a connection, and never twice in one
//! process.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::{Mutex, PoisonError};

use anyhow::{Result, bail};

/// Lowest port picked: above the ports services commonly take.
const FLOOR: u16 = 20_000;
/// Where the kernel's ephemeral range starts when it cannot be read
/// (Linux's default).
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;

/// Ports handed out by this process.
static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// `n` distinct loopback ports, free when picked, below the ephemeral range
/// and not given before in this process. The listeners are held until all
/// are picked, so no other process picks one meanwhile either.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let (low, high) = pick_range();
    let span = usize::from(high.saturating_sub(low));
    if span == 0 {
        bail!("no loopback ports to pick from in {low}..{high}");
    }
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    let given = given.get_or_insert_with(HashSet::new);
    // A random start keeps test processes running at once apart.
    let start = usize::try_from(random() % span as u64).unwrap_or(0);
    let mut held = Vec::with_capacity(n);
    for offset in 0..span {
        if held.len() == n {
            break;
        }
        let Ok(port) = u16::try_from(usize::from(low) + (start + offset) % span) else {
            continue;
        };
        if given.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push((port, listener));
        }
    }
    if held.len() < n {
        bail!("only {} of {n} free loopback ports left in {low}..{high}", held.len());
    }
    let ports: Vec<u16> = held.iter().map(|(port, _)| *port).collect();
    given.extend(&ports);
    Ok(ports)
}

/// The ports picked from: [`FLOOR`] up to the start of the kernel's
/// ephemeral range, or the ephemeral range itself where it leaves too few
/// below it (then outgoing connections may take a port again).
fn pick_range() -> (u16, u16) {
    let (low, high) = ephemeral_range();
    if low >= FLOOR + 4_096 { (FLOOR, low) } else { (low, high) }
}

/// The kernel's ephemeral port range, both ends included.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u16>);
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        .unwrap_or((DEFAULT_EPHEMERAL_LOW, 60_999))
}

/// 64 random bits from the standard library's per-process hash keys.
fn random() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_given_twice() {
        let first = free_ports(40).unwrap();
        let second = free_ports(40).unwrap();
        let all: HashSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 80, "{first:?} {second:?}");
        let (ephemeral, _) = ephemeral_range();
        assert!(ephemeral >= FLOOR + 4_096, "this machine's ephemeral range starts at {ephemeral}");
        assert!(all.iter().all(|p| (FLOOR..ephemeral).contains(p)), "{all:?}");
    }
}
