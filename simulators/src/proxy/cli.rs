//! `opgraph-sim proxy`: the flaky-link proxy from the command line.
//!
//! Prints `listening proxy=ADDR` on stdout once bound, then runs until
//! SIGTERM or Ctrl-C and prints the summary of what it carried
//! ([`ProxyStats`]'s `summary ...` lines). SIGUSR1 partitions the link on
//! demand, SIGUSR2 heals it, so scripts and tests driving the binary can
//! cut the link at a moment of their choosing.

use std::net::SocketAddr;
use std::time::Duration;

use bytesize::ByteSize;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use super::link::{LinkConfig, PartitionWindow};
use super::stats::ProxyStats;
use super::{FlakyProxy, PartitionMode, Protocol, ProxyConfig};
use crate::error::{Error, Result};
use crate::print;

/// Forward TCP or UDP through a simulated flaky link.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Transport to forward (QUIC runs over udp).
    #[arg(long, value_enum, default_value_t = Protocol::Tcp)]
    pub protocol: Protocol,
    /// Address clients connect to; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The real server.
    #[arg(long)]
    pub upstream: SocketAddr,
    /// Loss, delay, reordering and bandwidth.
    #[command(flatten)]
    pub link: LinkArgs,
    /// Cost of one simulated TCP loss, doubled per repeated loss [default: 200ms].
    #[arg(long, value_parser = crate::parse_duration)]
    pub rto: Option<Duration>,
    /// A scheduled partition, START+DURATION from the proxy's start, e.g. 10s+3s; repeatable.
    #[arg(long = "partition", value_name = "START+DURATION")]
    pub partitions: Vec<PartitionWindow>,
    /// What a partition does to connections.
    #[arg(long, value_enum, default_value_t = PartitionMode::Stall)]
    pub partition_mode: PartitionMode,
    /// Largest TCP read, the unit of delay and loss [default: 16KiB].
    #[arg(long)]
    pub tcp_chunk: Option<ByteSize>,
    /// Forget a UDP client mapping after this long without traffic [default: 60s].
    #[arg(long, value_parser = crate::parse_duration)]
    pub udp_idle_timeout: Option<Duration>,
}

/// The impairment of a link, per direction: what `opgraph-sim proxy` and
/// `opgraph-sim tunlink` (per IP packet) both apply.
#[derive(Debug, Clone, clap::Args)]
pub struct LinkArgs {
    /// Probability from 0 to 1 that an IP packet (tunlink), a UDP datagram or a TCP chunk (proxy: it arrives after an RTO) is lost [default: 0].
    #[arg(long)]
    pub loss: Option<f64>,
    /// One-way delay added in each direction, e.g. 25ms [default: 0s].
    #[arg(long, value_parser = crate::parse_duration)]
    pub latency: Option<Duration>,
    /// Delay varies uniformly within latency ± jitter [default: 0s].
    #[arg(long, value_parser = crate::parse_duration)]
    pub jitter: Option<Duration>,
    /// Probability that a datagram or packet is held back so later ones overtake it [default: 0].
    #[arg(long)]
    pub reorder: Option<f64>,
    /// How long a reordered datagram or packet is held back [default: 20ms].
    #[arg(long, value_parser = crate::parse_duration)]
    pub reorder_delay: Option<Duration>,
    /// Bandwidth cap per direction in bytes per second, e.g. 10MiB [default: unlimited].
    #[arg(long)]
    pub bandwidth: Option<ByteSize>,
    /// Token bucket depth of the bandwidth cap [default: 16KiB].
    #[arg(long)]
    pub burst: Option<ByteSize>,
    /// Bytes queued behind the bandwidth cap before datagrams or packets are dropped [default: 1MiB].
    #[arg(long)]
    pub queue: Option<ByteSize>,
    /// Seed of the link's RNG [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,
}

impl LinkArgs {
    /// The link these arguments describe, unset options at their
    /// defaults, with `rto` (the proxy's TCP loss cost), and its seed.
    pub fn into_config(self, rto: Option<Duration>) -> (LinkConfig, u64) {
        let defaults = LinkConfig::default();
        let link = LinkConfig {
            loss: self.loss.unwrap_or(defaults.loss),
            latency: self.latency.unwrap_or(defaults.latency),
            jitter: self.jitter.unwrap_or(defaults.jitter),
            reorder: self.reorder.unwrap_or(defaults.reorder),
            reorder_delay: self.reorder_delay.unwrap_or(defaults.reorder_delay),
            bandwidth: self.bandwidth.or(defaults.bandwidth),
            burst: self.burst.unwrap_or(defaults.burst),
            queue: self.queue.unwrap_or(defaults.queue),
            rto: rto.unwrap_or(defaults.rto),
        };
        (link, self.seed.unwrap_or_else(rand::random))
    }
}

impl ProxyArgs {
    /// The config these arguments describe; unset options keep the
    /// config's defaults. Not validated yet.
    pub fn into_config(self) -> ProxyConfig {
        let (link, seed) = self.link.into_config(self.rto);
        let mut config = ProxyConfig::new(self.protocol, self.upstream);
        config.listen = self.listen;
        config.link = link;
        config.partitions = self.partitions;
        config.partition_mode = self.partition_mode;
        config.seed = seed;
        if let Some(chunk) = self.tcp_chunk {
            config.tcp_chunk = chunk;
        }
        if let Some(idle) = self.udp_idle_timeout {
            config.udp_idle_timeout = idle;
        }
        config
    }
}

/// Runs the proxy until SIGTERM or Ctrl-C; see the module docs.
pub async fn run(args: ProxyArgs) -> Result<ProxyStats> {
    let proxy = FlakyProxy::start(args.into_config()).await?;
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::io("SIGTERM handler"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::io("SIGINT handler"))?;
    let mut partition =
        signal(SignalKind::user_defined1()).map_err(Error::io("SIGUSR1 handler"))?;
    let mut heal = signal(SignalKind::user_defined2()).map_err(Error::io("SIGUSR2 handler"))?;
    print(&format!("listening proxy={}\n", proxy.local_addr()))?;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = partition.recv() => proxy.set_partition(true),
            _ = heal.recv() => proxy.set_partition(false),
        }
    }
    info!("stopping");
    let stats = proxy.shutdown().await;
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
        proxy: ProxyArgs,
    }

    fn parse(args: &[&str]) -> std::result::Result<ProxyConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("proxy").chain(args.iter().copied()))
            .map(|cli| cli.proxy.into_config())
    }

    #[test]
    fn the_documented_command_line_parses() {
        let config = parse(&[
            "--protocol",
            "udp",
            "--upstream",
            "127.0.0.1:50051",
            "--loss",
            "0.1",
            "--latency",
            "25ms",
            "--jitter",
            "5ms",
            "--reorder",
            "0.01",
            "--bandwidth",
            "10MiB",
            "--partition",
            "10s+3s",
            "--partition",
            "30s+5s",
            "--partition-mode",
            "reset",
            "--seed",
            "42",
        ])
        .unwrap();
        assert_eq!(config.protocol, Protocol::Udp);
        assert_eq!(config.link.loss, 0.1);
        assert_eq!(config.link.latency, Duration::from_millis(25));
        assert_eq!(config.link.jitter, Duration::from_millis(5));
        assert_eq!(config.link.bandwidth, Some(ByteSize::mib(10)));
        assert_eq!(config.partitions.len(), 2);
        assert_eq!(config.partitions[1].start, Duration::from_secs(30));
        assert_eq!(config.partition_mode, PartitionMode::Reset);
        assert_eq!(config.seed, 42);
        assert_eq!(config.link.rto, LinkConfig::default().rto, "unset options keep defaults");
        config.validate().unwrap();
    }

    #[test]
    fn bad_values_are_rejected() {
        for args in [
            &["--upstream", "127.0.0.1:1", "--latency", "fast"][..],
            &["--upstream", "127.0.0.1:1", "--partition", "10s"],
            &["--upstream", "127.0.0.1:1", "--bandwidth", "lots"],
            &["--upstream", "nowhere"],
            &["--loss", "0.1"],
        ] {
            assert!(parse(args).is_err(), "{args:?} should not parse");
        }
        let out_of_range = parse(&["--upstream", "127.0.0.1:1", "--loss", "2"]).unwrap();
        assert!(out_of_range.validate().is_err());
    }
}
