//! A private ClickHouse server for tests: Debian's `clickhouse-server`
//! (installed by `deploy/scripts/install-test-deps.sh`) started on
//! 127.0.0.1 on free ports, with its data, temporary files and logs in a
//! temporary directory, and killed when dropped.
//!
//! The configuration is written here rather than copied from
//! `/etc/clickhouse-server`: the packaged file carries listeners, graphite
//! senders and cluster examples a test does not want, and a generated file
//! does not depend on how a given release lays its defaults out.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::free_ports;

pub mod cluster;

/// How long a server may take to answer (18.16 needs well under a second
/// here; the margin is for a loaded CI machine).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// A port picked as free may be taken before the server binds it.
const START_ATTEMPTS: usize = 3;

/// A running ClickHouse server; killed (and its directory removed) on drop.
pub struct ClickHouse {
    child: Option<Child>,
    dir: tempfile::TempDir,
    http_port: u16,
    tcp_port: u16,
    /// The HTTPS interface's port when started by [`Self::start_tls`], else 0.
    https_port: u16,
    /// Configuration elements added to the generated `config.xml` (a
    /// cluster node's `remote_servers`, `macros`, `zookeeper`).
    extra_config: String,
    /// Settings of the default user's profile.
    profile: &'static str,
}

/// Waits until `system.query_log` holds every query `client` sent before
/// the call (started with [`ClickHouse::start_logging_queries`]). `SYSTEM
/// FLUSH LOGS` writes only what the log thread has already taken from its
/// queue, so the last queries before it may be missing: a marker query is
/// sent last and flushed for until its end is logged (the queue is first
/// in, first out). The marker and the polling start with `WITH`, not
/// `SELECT`, so that counts of `SELECT`s leave them out. Panics after
/// about 20 s.
pub async fn flush_query_log(client: &clickhouse::Client) {
    static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let marker = format!("flushed {} {n} {}", std::process::id(), crate::now_ms());
    let sent = client.query(&format!("WITH '{marker}' AS marker SELECT marker")).execute();
    sent.await.expect("the marker query runs");
    for _ in 0..200 {
        client.query("SYSTEM FLUSH LOGS").execute().await.expect("SYSTEM FLUSH LOGS");
        let found: u64 = client
            .query(
                "WITH 2 AS finished SELECT count() FROM system.query_log
                 WHERE type = finished AND query LIKE ?",
            )
            .bind(format!("WITH '{marker}'%"))
            .fetch_one()
            .await
            .expect("the query log is read");
        if found > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the query log never showed the marker query");
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

impl ClickHouse {
    /// Starts a fresh, empty server and waits until it answers.
    /// Fails (never skips) when the server is not installed.
    pub async fn start() -> Result<ClickHouse> {
        Self::start_fresh(String::new(), "", false).await
    }

    /// [`Self::start`] with an HTTPS interface as well ([`Self::https_url`]),
    /// its certificate for 127.0.0.1 signed by a CA made for this server
    /// ([`Self::ca_file`]).
    pub async fn start_tls() -> Result<ClickHouse> {
        Self::start_fresh(String::new(), "", true).await
    }

    /// [`Self::start`] with every query of every user written to
    /// `system.query_log` (read it after [`flush_query_log`]), for tests and
    /// benchmarks that count or replay the SQL a process sent.
    pub async fn start_logging_queries() -> Result<ClickHouse> {
        let query_log = "    <query_log><database>system</database><table>query_log</table>\
                         <flush_interval_milliseconds>1000</flush_interval_milliseconds></query_log>";
        Self::start_fresh(query_log.to_owned(), "<log_queries>1</log_queries>", false).await
    }

    async fn start_fresh(
        extra_config: String,
        profile: &'static str,
        tls: bool,
    ) -> Result<ClickHouse> {
        let binary = server_binary().context(
            "clickhouse-server is not installed: run `bash deploy/scripts/install-test-deps.sh` \
             (Debian's clickhouse-server package), as the project's test command does",
        )?;
        let dir = tempfile::Builder::new().prefix("opgraph-clickhouse-").tempdir()?;
        let mut server = ClickHouse {
            child: None,
            dir,
            http_port: 0,
            tcp_port: 0,
            https_port: 0,
            extra_config,
            profile,
        };
        if tls {
            server.write_certificates()?;
        }
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let ports = free_ports(3)?;
            (server.http_port, server.tcp_port) = (ports[0], ports[1]);
            if tls {
                server.https_port = ports[2];
            }
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
        let mut server = ClickHouse {
            child: None,
            dir,
            http_port,
            tcp_port,
            https_port: 0,
            extra_config,
            profile: "",
        };
        server.launch(&binary).await?;
        Ok(server)
    }

    /// The HTTP interface, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// The HTTPS interface, e.g. `https://127.0.0.1:40124`; only after
    /// [`Self::start_tls`].
    pub fn https_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.https_port)
    }

    /// PEM of the CA that signed the HTTPS certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA and a server certificate for 127.0.0.1 signed by it: a client
    /// that trusts `ca.pem` verifies the chain as it would in production.
    fn write_certificates(&self) -> Result<()> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate()?;
        let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])?
            .signed_by(&server_key, &issuer)?;
        let root = self.dir.path();
        std::fs::write(root.join("ca.pem"), ca.pem())?;
        std::fs::write(root.join("server.pem"), server.pem())?;
        std::fs::write(root.join("server.key"), server_key.serialize_pem())?;
        Ok(())
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
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // Where the answering server keeps its data, rather than
            // `/ping`: a port picked as free can be bound by another
            // process first, and then our server exits while the other
            // one answers in its place.
            let answer = async {
                http.post(self.url())
                    .body("SELECT data_path FROM system.databases WHERE name = 'system'")
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await
            };
            if let Ok(path) = answer.await {
                let ours = self.dir.path().join("data");
                if Path::new(path.trim()).starts_with(&ours) {
                    return Ok(());
                }
                self.kill();
                bail!(
                    "port {} is served by another process (data path {:?}, ours under {}): {}",
                    self.http_port,
                    path.trim(),
                    ours.display(),
                    self.log_tail()
                );
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
                    "clickhouse-server did not answer within {START_TIMEOUT:?}: {}",
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
{tls}{extra}
</yandex>
"#,
            http = self.http_port,
            tcp = self.tcp_port,
            tls = self.tls_config(),
            extra = self.extra_config,
        )
    }
}

impl ClickHouse {
    /// The HTTPS listener and its certificate, when there is one.
    fn tls_config(&self) -> String {
        if self.https_port == 0 {
            return String::new();
        }
        let root = self.dir.path().display();
        format!(
            r#"    <https_port>{port}</https_port>
    <openSSL><server>
        <certificateFile>{root}/server.pem</certificateFile>
        <privateKeyFile>{root}/server.key</privateKeyFile>
        <verificationMode>none</verificationMode>
        <loadDefaultCAFile>false</loadDefaultCAFile>
        <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
    </server></openSSL>
"#,
            port = self.https_port
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_whose_port_another_server_answers_on_does_not_start() {
        let first = ClickHouse::start().await.unwrap();
        let tcp = free_ports(1).unwrap()[0];
        // The second cannot bind the first's HTTP port and exits, while the
        // first answers there.
        let second = ClickHouse::start_with(first.http_port, tcp, String::new()).await;
        let error = second.err().expect("a server answering for another is refused");
        assert!(format!("{error:#}").contains("served by another process"), "{error:#}");
    }
}
