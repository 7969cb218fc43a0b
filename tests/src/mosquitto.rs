//! A real Mosquitto broker (the Debian package, installed by
//! deploy/scripts/install-test-deps.sh) on a free loopback port, for the
//! MQTT tests and the MQTT benchmark. Killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use super::ports::free_ports;

/// How long Mosquitto may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Starts on a fresh port after Mosquitto exited at start.
const START_ATTEMPTS: u32 = 3;
/// Mosquitto exited at start: its port was taken, say.
#[derive(Debug)]
struct Exited;

impl std::fmt::Display for Exited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mosquitto exited at start (see its stderr above)")
    }
}

impl std::error::Error for Exited {}

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

/// A loopback port for one listener ([`free_ports`]).
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

/// Whether process `pid` holds the listening socket on 127.0.0.1:`port`:
/// the socket's inode, from `/proc/net/tcp`, among the process's open
/// files. A connection that succeeds proves less: when another process
/// took the port first, Mosquitto exits, and the other one accepts.
fn listens_on(pid: u32, port: u16) -> Result<bool> {
    let table = std::fs::read_to_string("/proc/net/tcp").context("read /proc/net/tcp")?;
    // Address and port in hex, the address in network byte order read as
    // a little-endian word; state 0A is LISTEN.
    let local = format!("0100007F:{port:04X}");
    let inode = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let listening = fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A");
        listening.then(|| fields.get(9).map(|inode| format!("socket:[{inode}]"))).flatten()
    });
    let Some(socket) = inode else {
        return Ok(false);
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?;
    Ok(fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == Path::new(&socket))))
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
        Mosquitto::start_on(dir, logins, extra, extra_ports, free_port).await
    }

    /// [`Mosquitto::start`] on the ports `pick` gives. A port is free when
    /// picked, not necessarily when Mosquitto binds it (another test may
    /// take it in between): one that exits at once is started again on the
    /// next port.
    async fn start_on(
        dir: &Path,
        logins: &[(&str, &str)],
        extra: &str,
        extra_ports: &[u16],
        mut pick: impl FnMut() -> Result<u16>,
    ) -> Result<Mosquitto> {
        let mut attempt = 1;
        loop {
            match Mosquitto::start_once(dir, logins, extra, extra_ports, pick()?).await {
                Err(e) if attempt < START_ATTEMPTS && e.is::<Exited>() => {
                    eprintln!("mosquitto exited at start (attempt {attempt}): trying another port");
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once(
        dir: &Path,
        logins: &[(&str, &str)],
        extra: &str,
        extra_ports: &[u16],
        port: u16,
    ) -> Result<Mosquitto> {
        let dir = dir.join("mosquitto");
        std::fs::create_dir_all(&dir)?;
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
            let child = &mut mosquitto.child;
            let accepting = async {
                while TcpStream::connect(("127.0.0.1", *port)).await.is_err() {
                    if child.try_wait()?.is_some() {
                        return Err(anyhow::Error::new(Exited));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok::<_, anyhow::Error>(())
            };
            tokio::time::timeout(START_TIMEOUT, accepting)
                .await
                .with_context(|| format!("mosquitto not accepting on port {port}"))??;
        }
        // Something else may answer on a port Mosquitto could not bind.
        let pid = mosquitto.child.id().ok_or(Exited)?;
        for port in [port].iter().chain(extra_ports) {
            if !listens_on(pid, *port)? {
                return Err(Exited.into());
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_taken_before_mosquitto_binds_it_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        // Bound, not listening: Mosquitto cannot bind it, and nothing
        // answers on it.
        let taken = tokio::net::TcpSocket::new_v4().unwrap();
        taken.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let once = Mosquitto::start_once(dir.path(), &[], "", &[], taken_port).await;
        assert!(once.as_ref().is_err_and(|e| e.is::<Exited>()), "{:?}", once.err());
        let mut ports = [Ok(taken_port), free_port()].into_iter();
        let pick = || ports.next().unwrap();
        let mosquitto = Mosquitto::start_on(dir.path(), &[], "", &[], pick).await.unwrap();
        assert_ne!(mosquitto.port, taken_port);
        TcpStream::connect(("127.0.0.1", mosquitto.port)).await.unwrap();
    }

    #[tokio::test]
    async fn a_port_another_process_listens_on_is_not_taken_for_mosquittos() {
        let dir = tempfile::tempdir().unwrap();
        // Connections to it succeed, as they would to Mosquitto.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let once = Mosquitto::start_once(dir.path(), &[], "", &[], taken_port).await;
        assert!(once.as_ref().is_err_and(|e| e.is::<Exited>()), "{:?}", once.err());
    }
}
