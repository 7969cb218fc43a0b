//! `opgraph-tests`: a harness that starts the real Opgraph binaries on
//! loopback, and the end-to-end scenarios (in `tests/`) that drive them.
//!
//! Binaries are found beside the test executable (`target/<profile>/`), so
//! build them first: the project's test command runs
//! `cargo build --workspace --bins` before `cargo test`. `OPGRAPH_BIN_DIR`
//! points elsewhere.
#![allow(clippy::expect_used)]

pub mod backends;
pub mod bench;
pub mod clickhouse;
pub mod edge;
pub mod https_endpoint;
pub mod loop_disk;
pub mod mosquitto;
pub mod ports;

pub use ports::free_ports;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a binary may take to print its `listening` lines.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Path of a workspace binary built by `cargo build`.
pub fn binary(name: &str) -> Result<PathBuf> {
    let dir = match std::env::var_os("OPGRAPH_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let exe = std::env::current_exe()?;
            // target/<profile>/deps/<test> -> target/<profile>
            exe.parent()
                .and_then(|deps| deps.parent())
                .map(PathBuf::from)
                .context("cannot locate the target directory")?
        }
    };
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} not found: run `cargo build --workspace --bins` first (or set OPGRAPH_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}

/// A running binary: killed when dropped.
pub struct Process {
    pub child: Child,
    /// `listening NAME=ADDR` lines seen on stdout, by NAME.
    pub addrs: HashMap<String, String>,
    /// Other stdout lines seen before the first `listening` line.
    pub banner: Vec<String>,
    /// Reads stdout after the start until the child closes it, keeping the
    /// last [`KEPT_LINES`] lines (a closing summary, for [`Self::stop`]).
    rest: tokio::task::JoinHandle<Vec<String>>,
}

/// Stdout lines a [`Process`] keeps after its start.
const KEPT_LINES: usize = 1000;

impl Process {
    /// Starts `name` with `env` and waits until it has printed a
    /// `listening` line for each of `expect` (e.g. `["http"]`).
    pub async fn start(
        name: &str,
        args: &[&str],
        env: &[(&str, String)],
        expect: &[&str],
    ) -> Result<Process> {
        let mut command = Command::new(binary(name)?);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("OPGRAPH_LOG", std::env::var("OPGRAPH_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().with_context(|| format!("spawn {name}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut addrs = HashMap::new();
        let mut banner = Vec::new();
        let wait = async {
            while expect.iter().any(|e| !addrs.contains_key(*e)) {
                let Some(line) = lines.next_line().await? else {
                    bail!("{name} exited before listening (see its stderr above)");
                };
                match line.strip_prefix("listening ").and_then(|rest| rest.split_once('=')) {
                    Some((kind, addr)) => {
                        addrs.insert(kind.to_owned(), addr.trim().to_owned());
                    }
                    None => banner.push(line),
                }
            }
            Ok(())
        };
        tokio::time::timeout(START_TIMEOUT, wait)
            .await
            .with_context(|| format!("{name} did not start within {START_TIMEOUT:?}"))??;
        // Keep draining stdout so the child never blocks on a full pipe.
        let rest = tokio::spawn(async move {
            let mut kept = std::collections::VecDeque::new();
            while let Ok(Some(line)) = lines.next_line().await {
                if kept.len() == KEPT_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
            kept.into()
        });
        Ok(Process { child, addrs, banner, rest })
    }

    /// Sends a signal by name (`USR1`, `HUP`, ...) without waiting.
    pub async fn signal(&self, name: &str) -> Result<()> {
        let pid = self.child.id().context("already exited")?;
        let status =
            Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().await?;
        if !status.success() {
            bail!("kill -{name} {pid} failed");
        }
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit status.
    pub async fn terminate(mut self) -> Result<std::process::ExitStatus> {
        self.sigterm_and_wait().await
    }

    /// [`Self::terminate`], also returning what the child printed on stdout
    /// after its start (the last `KEPT_LINES` lines), e.g. its summary.
    /// Waits for stdout to close too, which a grandchild holding it would
    /// delay: bounded like the exit.
    pub async fn stop(mut self) -> Result<(std::process::ExitStatus, Vec<String>)> {
        let exit = self.sigterm_and_wait().await?;
        let rest = tokio::time::timeout(Duration::from_secs(30), self.rest).await??;
        Ok((exit, rest))
    }

    async fn sigterm_and_wait(&mut self) -> Result<std::process::ExitStatus> {
        let pid = self.child.id().context("already exited")?;
        let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        Ok(tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??)
    }

    /// SIGKILL: no chance to flush anything.
    pub async fn kill9(mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

/// A cloud on an embedded store in a temporary directory.
pub struct Cloud {
    pub process: Process,
    pub url: String,
    pub key: String,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// Milliseconds since the Unix epoch, as the cloud stamps its events.
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// An HTTP client for API tests: a minute at most per request, so a hung
/// cloud fails the test instead of stalling it.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .expect("an HTTP client")
}

pub const TEST_BOOTSTRAP_KEY: &str = "og_testbootstrapkey0123456789abcdef";

impl Cloud {
    /// A fresh cloud with the test bootstrap key and extra environment.
    pub async fn start(extra_env: &[(&str, String)]) -> Result<Cloud> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let mut cloud = Self::start_in(&dir, extra_env).await?;
        cloud._tmp = Some(tmp);
        Ok(cloud)
    }

    /// A cloud on an existing data directory (to restart one).
    pub async fn start_in(dir: &std::path::Path, extra_env: &[(&str, String)]) -> Result<Cloud> {
        let mut env = vec![
            ("OPGRAPH_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_GRPC_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_QUIC_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_DATA_DIR", dir.display().to_string()),
            ("OPGRAPH_BOOTSTRAP_KEY", TEST_BOOTSTRAP_KEY.to_owned()),
        ];
        env.extend(extra_env.iter().cloned());
        let key = env
            .iter()
            .rev()
            .find(|(k, _)| *k == "OPGRAPH_BOOTSTRAP_KEY")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let last = |name: &str| env.iter().rev().find(|(k, _)| *k == name).map(|(_, v)| v.as_str());
        let mut expect = vec!["http"];
        if last("OPGRAPH_GRPC_ADDR") != Some("off") {
            expect.push("grpc");
        }
        if last("OPGRAPH_QUIC_ADDR") != Some("off") {
            expect.push("quic");
        }
        let process = Process::start("opgraph-cloud", &[], &env, &expect).await?;
        let url = format!("http://{}", process.addrs["http"]);
        Ok(Cloud { process, url, key, data_dir: dir.to_path_buf(), _tmp: None })
    }

    /// Takes the temporary directory out, so it outlives this process.
    pub fn keep_dir(&mut self) -> Option<tempfile::TempDir> {
        self._tmp.take()
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// The node's `/metrics` text, read with the operator's key.
    pub async fn metrics(&self) -> Result<String> {
        let response = self.http().get(self.at("/metrics")).bearer_auth(&self.key).send().await?;
        anyhow::ensure!(response.status().is_success(), "/metrics: {}", response.status());
        Ok(response.text().await?)
    }

    /// One request to the API as `key`, with `body` as JSON: the status and
    /// the answer (`Null` when it is not JSON).
    pub async fn call(
        &self,
        client: &reqwest::Client,
        key: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let mut request = client.request(method, self.at(path)).bearer_auth(key);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.expect("the cloud answers");
        let status = response.status();
        (status, response.json().await.unwrap_or(serde_json::Value::Null))
    }
}
