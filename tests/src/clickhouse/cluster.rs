//! A private ClickHouse cluster for tests: one ZooKeeper (Debian's
//! `zookeeper` package, for replication and `ON CLUSTER` DDL) and
//! `shards × replicas` clickhouse-servers, all on 127.0.0.1 on free ports,
//! each node knowing the cluster [`CLUSTER`] in its `remote_servers` and its
//! own `{shard}`/`{replica}` macros, as `deploy/clickhouse/cluster/` lays
//! out for production. Everything is killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ClickHouse;
use crate::free_ports;

/// The cluster's name in `remote_servers`.
pub const CLUSTER: &str = "opgraph";

/// How long ZooKeeper may take to serve (under a second here).
const ZOOKEEPER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Ports picked as free may be taken before the servers bind them.
const START_ATTEMPTS: usize = 3;

/// A running cluster.
/// ZooKeeper's `tickTime` of 500 ms caps sessions at 10 s (20 ticks), so
/// the others see a killed node's replica lost within 10 s.
/// Field order: the servers stop before ZooKeeper.
pub struct Cluster {
    /// `nodes[shard][replica]`.
    pub nodes: Vec<Vec<ClickHouse>>,
    _zookeeper: ZooKeeper,
}

impl Cluster {
    /// Starts ZooKeeper and `shards × replicas` servers and waits until all
    /// answer. Fails (never skips) when a package is not installed.
    pub async fn start(shards: usize, replicas: usize) -> Result<Cluster> {
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            match Cluster::try_start(shards, replicas).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("the cluster did not start")))
    }

    async fn try_start(shards: usize, replicas: usize) -> Result<Cluster> {
        let zookeeper = ZooKeeper::start().await?;
        // (http, tcp, interserver) per node, shard-major.
        let ports: Vec<(u16, u16, u16)> =
            free_ports(3 * shards * replicas)?.chunks(3).map(|p| (p[0], p[1], p[2])).collect();
        let remote_servers: String = ports
            .chunks(replicas)
            .map(|shard| {
                let replicas: String = shard
                    .iter()
                    .map(|(_, tcp, _)| {
                        format!("<replica><host>127.0.0.1</host><port>{tcp}</port></replica>")
                    })
                    .collect();
                format!(
                    "<shard><internal_replication>true</internal_replication>{replicas}</shard>"
                )
            })
            .collect();
        let mut nodes = Vec::new();
        for (shard, shard_ports) in ports.chunks(replicas).enumerate() {
            let mut shard_nodes = Vec::new();
            for (replica, (http, tcp, interserver)) in shard_ports.iter().enumerate() {
                let extra = format!(
                    r#"    <interserver_http_host>127.0.0.1</interserver_http_host>
    <interserver_http_port>{interserver}</interserver_http_port>
    <remote_servers><{CLUSTER}>{remote_servers}</{CLUSTER}></remote_servers>
    <zookeeper><node><host>127.0.0.1</host><port>{zk}</port></node></zookeeper>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
    <macros><shard>{s}</shard><replica>r{r}</replica></macros>"#,
                    zk = zookeeper.port,
                    s = shard + 1,
                    r = replica + 1,
                );
                let node = ClickHouse::start_with(*http, *tcp, extra).await?;
                // Each node holds its ZooKeeper session before the next
                // starts, so a setup failure names the node it is about.
                node.await_zookeeper().await?;
                shard_nodes.push(node);
            }
            nodes.push(shard_nodes);
        }
        Ok(Cluster { nodes, _zookeeper: zookeeper })
    }

    /// The node the cloud talks to: the first replica of the first shard.
    pub fn entry(&self) -> &ClickHouse {
        &self.nodes[0][0]
    }
}

impl ClickHouse {
    /// Waits until the server reads from ZooKeeper.
    async fn await_zookeeper(&self) -> Result<()> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + ZOOKEEPER_START_TIMEOUT;
        loop {
            let answer = http
                .post(self.url())
                .body("SELECT count() FROM system.zookeeper WHERE path = '/'")
                .send()
                .await;
            if let Ok(response) = answer
                && response.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("clickhouse-server has no ZooKeeper session: {}", self.log_tail());
            }
            // Polling: the server offers no notification.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A standalone ZooKeeper on a free loopback port, data in a temporary
/// directory; killed on drop.
pub struct ZooKeeper {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

/// The jar of Debian's `zookeeper` package.
fn zookeeper_classpath() -> Option<String> {
    let jar = PathBuf::from("/usr/share/java/zookeeper.jar");
    jar.is_file().then(|| jar.display().to_string())
}

impl ZooKeeper {
    pub async fn start() -> Result<ZooKeeper> {
        let jar = zookeeper_classpath().context(
            "ZooKeeper is not installed: run `bash deploy/scripts/install-test-deps.sh` \
             (Debian's zookeeper package), as the project's test command does",
        )?;
        let dir = tempfile::Builder::new().prefix("opgraph-zookeeper-").tempdir()?;
        let port = free_ports(1)?[0];
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        let config = dir.path().join("zoo.cfg");
        std::fs::write(
            &config,
            format!(
                "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=srvr\n",
                data.display()
            ),
        )?;
        let child = Command::new("java")
            .args(["-Xmx256m", "-cp", &jar, "org.apache.zookeeper.server.quorum.QuorumPeerMain"])
            .arg(&config)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn java (ZooKeeper)")?;
        let mut zookeeper = ZooKeeper { child, port, _dir: dir };
        let deadline = Instant::now() + ZOOKEEPER_START_TIMEOUT;
        loop {
            if zookeeper.answers().await {
                return Ok(zookeeper);
            }
            if let Some(status) = zookeeper.child.try_wait()? {
                bail!("ZooKeeper exited with {status} before answering");
            }
            if Instant::now() > deadline {
                bail!("ZooKeeper did not answer within {ZOOKEEPER_START_TIMEOUT:?}");
            }
            // Polling: ZooKeeper offers no readiness notification.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether ZooKeeper accepts sessions. `ruok` is not enough: it answers
    /// `imok` as soon as the port is bound, about half a second before the
    /// server takes sessions, and a clickhouse-server 18.16 whose first
    /// session is refused dies later of a NULL session in
    /// `zkutil::ZooKeeper::createImpl`. `srvr` reports the version only
    /// once the server is serving ("not currently serving requests" before).
    async fn answers(&self) -> bool {
        let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        let mut answer = Vec::new();
        stream.write_all(b"srvr").await.is_ok()
            && tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer))
                .await
                .is_ok()
            && answer.starts_with(b"Zookeeper version:")
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
