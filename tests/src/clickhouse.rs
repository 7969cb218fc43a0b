//! A private ClickHouse server for tests: Debian's `clickhouse-server`
//! (installed by `deploy/scripts/install-test-deps.sh`) started on
//! 127.0.0.1 on free ports, with its data, temporary files and logs in a
//! temporary directory, and killed when dropped.
//!
//! The configuration is written here rather than copied from
//! `/etc/clickhouse-server`: the packaged file carries listeners, graphite
//! senders and cluster examples a test does not want, and a generated file
//! does not depend on how a given release lays its defaults out.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub mod cluster;

/// How long a server may take to answer `/ping` (18.16 needs well under a
/// second here; the margin is for a loaded CI machine).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// A port picked as free may be taken before the server binds it.
const START_ATTEMPTS: usize = 3;

/// A running ClickHouse server; killed (and its directory removed) on drop.
pub struct ClickHouse {
    child: Option<Child>,
    dir: tempfile::TempDir,
    http_port: u16,
    tcp_port: u16,
    /// Configuration elements added to the generated `config.xml` (a
    /// cluster node's `remote_servers`, `macros`, `zookeeper`).
    extra_config: String,
    /// Settings of the default user's profile.
    profile: &'static str,
}

/// Where Debian puts the server, or `None` when it is not installed.
pub fn server_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("clickhouse-server"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        ["/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl ClickHouse {
    /// Starts a fresh, empty server and waits until it answers `/ping`.
    /// Fails (never skips) when the server is not installed.
    pub async fn start() -> Result<ClickHouse> {
        Self::start_fresh(String::new(), "").await
    }

    /// [`Self::start`] with every query of every user written to
    /// `system.query_log` (flushed by `SYSTEM FLUSH LOGS`), for benchmarks
    /// that replay the SQL a process sent.
    pub async fn start_logging_queries() -> Result<ClickHouse> {
        let query_log = "    <query_log><database>system</database><table>query_log</table>\
                         <flush_interval_milliseconds>1000</flush_interval_milliseconds></query_log>";
        Self::start_fresh(query_log.to_owned(), "<log_queries>1</log_queries>").await
    }

    async fn start_fresh(extra_config: String, profile: &'static str) -> Result<ClickHouse> {
        let binary = server_binary().context(
            "clickhouse-server is not installed: run `bash deploy/scripts/install-test-deps.sh` \
             (Debian's clickhouse-server package), as the project's test command does",
        )?;
        let dir = tempfile::Builder::new().prefix("opgraph-clickhouse-").tempdir()?;
        let mut server =
            ClickHouse { child: None, dir, http_port: 0, tcp_port: 0, extra_config, profile };
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            server.http_port = free_port()?;
            server.tcp_port = free_port()?;
            match server.launch(&binary).await {
                Ok(()) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("clickhouse-server did not start")))
    }

    /// Starts a server on the given ports with `extra_config` in its
    /// configuration; one attempt (the caller picked the ports).
    pub(crate) async fn start_with(
        http_port: u16,
        tcp_port: u16,
        extra_config: String,
    ) -> Result<ClickHouse> {
        let binary = server_binary().context("clickhouse-server is not installed")?;
        let dir = tempfile::Builder::new().prefix("opgraph-clickhouse-").tempdir()?;
        let mut server =
            ClickHouse { child: None, dir, http_port, tcp_port, extra_config, profile: "" };
        server.launch(&binary).await?;
        Ok(server)
    }

    /// The HTTP interface, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// The native-protocol port, for `clickhouse-client --port`.
    pub fn tcp_port(&self) -> u16 {
        self.tcp_port
    }

    /// Kills the server (as a crash would); its data stays for [`Self::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        let binary = server_binary().context("clickhouse-server is not installed")?;
        self.launch(&binary).await
    }

    async fn launch(&mut self, binary: &Path) -> Result<()> {
        let root = self.dir.path();
        for sub in ["data", "tmp", "user_files", "format_schemas", "log"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        let config = root.join("config.xml");
        std::fs::write(&config, self.config_xml())?;
        std::fs::write(root.join("users.xml"), USERS_XML.replace("{profile}", self.profile))?;
        let child = Command::new(binary)
            .arg(format!("--config-file={}", config.display()))
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A crash report goes to stderr, not to the log files.
            .stderr(std::fs::File::create(root.join("log/stderr.log"))?)
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        self.child = Some(child);
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let ping = format!("{}/ping", self.url());
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(response) = http.get(&ping).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "clickhouse-server exited with {status} before answering: {}",
                    self.log_tail()
                );
            }
            if Instant::now() > deadline {
                self.kill();
                bail!(
                    "clickhouse-server did not answer /ping within {START_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
            // Polling: the server offers no readiness notification.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the server's error log, for failure messages.
    pub fn log_tail(&self) -> String {
        let read = |name: &str| {
            std::fs::read_to_string(self.dir.path().join("log").join(name)).unwrap_or_default()
        };
        let text = read("server.err.log") + &read("stderr.log");
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    fn config_xml(&self) -> String {
        let root = self.dir.path().display();
        format!(
            r#"<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>{root}/log/server.log</log>
        <errorlog>{root}/log/server.err.log</errorlog>
        <size>10M</size>
        <count>1</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{http}</http_port>
    <tcp_port>{tcp}</tcp_port>
    <path>{root}/data/</path>
    <tmp_path>{root}/tmp/</tmp_path>
    <user_files_path>{root}/user_files/</user_files_path>
    <format_schema_path>{root}/format_schemas/</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
{extra}
</yandex>
"#,
            http = self.http_port,
            tcp = self.tcp_port,
            extra = self.extra_config,
        )
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One passwordless user reachable from loopback only.
const USERS_XML: &str = r#"<?xml version="1.0"?>
<yandex>
    <profiles><default>{profile}</default></profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas><default></default></quotas>
</yandex>
"#;
