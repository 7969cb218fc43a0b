//! The crate's one error type.

use std::io;
use std::net::SocketAddr;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every problem found in a config, each with its key path.
    #[error("invalid config: {}", .0.join("; "))]
    InvalidConfig(Vec<String>),
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    /// The MQTT broker could not be reached or did not acknowledge.
    #[error("mqtt {broker}: {reason}")]
    Mqtt { broker: String, reason: String },
    #[error("{context}: {source}")]
    Io { context: &'static str, source: io::Error },
}

impl Error {
    pub fn io(context: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Error::Io { context, source }
    }

    /// Whether trying again unchanged may succeed (a port in use may be
    /// freed; a bad config stays bad).
    pub fn retryable(&self) -> bool {
        !matches!(self, Error::InvalidConfig(_))
    }
}
