//! A real Mosquitto broker (the Debian package, installed by
//! deploy/scripts/install-test-deps.sh) on a free loopback port, for the
//! MQTT tests and the MQTT benchmark. Killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// How long Mosquitto may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Mosquitto {
    child: Child,
    pub port: u16,
}

/// A system program by name (PATH, then /usr/sbin and /usr/bin).
pub fn system_binary(name: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{name} not found: run deploy/scripts/install-test-deps.sh (installs mosquitto)"
            )
        })
}

/// A loopback port free at the time of asking.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Mosquitto {
    /// Starts Mosquitto with its files in `dir/mosquitto`: a listener on a
    /// free loopback port, `logins` (none: anonymous clients), no
    /// persistence, and `extra` configuration lines (more listeners, limits);
    /// waits until it accepts connections on its port and `extra_ports`.
    pub async fn start(
        dir: &Path,
        logins: &[(&str, &str)],
        extra: &str,
        extra_ports: &[u16],
    ) -> Result<Mosquitto> {
        let dir = dir.join("mosquitto");
        std::fs::create_dir_all(&dir)?;
        let port = free_port()?;
        let mut conf = format!(
            "listener {port} 127.0.0.1\npersistence false\nmax_queued_messages 1000000\n\
             user root\nlog_dest stderr\nlog_type error\nlog_type warning\n"
        );
        if logins.is_empty() {
            conf.push_str("allow_anonymous true\n");
        } else {
            let passwd = dir.join("passwd");
            for (i, (user, pass)) in logins.iter().enumerate() {
                let mut command = Command::new(system_binary("mosquitto_passwd")?);
                if i == 0 {
                    command.arg("-c");
                }
                let status = command.arg("-b").arg(&passwd).args([user, pass]).status().await?;
                if !status.success() {
                    bail!("mosquitto_passwd failed");
                }
            }
            conf.push_str(&format!("allow_anonymous false\npassword_file {}\n", passwd.display()));
        }
        conf.push_str(extra);
        let path = dir.join("mosquitto.conf");
        std::fs::write(&path, conf)?;
        let child = Command::new(system_binary("mosquitto")?)
            .arg("-c")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("spawn mosquitto")?;
        let mut mosquitto = Mosquitto { child, port };
        for port in [port].iter().chain(extra_ports) {
            let accepting = async {
                while TcpStream::connect(("127.0.0.1", *port)).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::time::timeout(START_TIMEOUT, accepting)
                .await
                .with_context(|| format!("mosquitto not accepting on port {port}"))?;
        }
        if mosquitto.child.try_wait()?.is_some() {
            bail!("mosquitto exited (see its stderr above)");
        }
        Ok(mosquitto)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
