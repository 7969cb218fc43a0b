//! The crate's one error type.
//!
//! Every variant carries the context needed to act on it (the file, the
//! sequence number, the limit that was hit), and [`Error::retryable`] tells
//! a caller whether trying the same thing again later can succeed: the
//! ingest path uses it to answer a device with "try again" instead of
//! "rejected".

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Result with the gateway's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the gateway library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is unusable; one entry per problem, each starting
    /// with its key path (`segment_bytes: ...`).
    #[error("invalid configuration: {}", .problems.join("; "))]
    InvalidConfig {
        /// `key: reason` for every problem found.
        problems: Vec<String>,
    },

    /// A file operation failed.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done (`write segment`, `fsync`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// An append could not be made durable within the configured wait
    /// (disk full, failing disk). Nothing of the failed part is visible to
    /// readers; retrying later can succeed.
    #[error(
        "append starting at sequence {first_seq} not durable after {waited:?}: {reason} ({})",
        .path.display()
    )]
    NotDurable {
        /// The first sequence number the append would have received.
        first_seq: u64,
        /// The segment file being written.
        path: PathBuf,
        /// The last I/O error seen.
        reason: String,
        /// How long the append waited for the disk.
        waited: Duration,
    },

    /// A single record is larger than a segment may hold.
    #[error("record of {size} bytes exceeds the limit of {limit} bytes (segment_bytes)")]
    RecordTooLarge {
        /// Encoded size of the record, header included.
        size: u64,
        /// The largest encoded record accepted.
        limit: u64,
    },

    /// One append is larger than the whole buffer (`max_bytes`): it can
    /// never fit, whatever is acknowledged or dropped.
    #[error("append of {size} bytes can never fit in max_bytes = {limit}")]
    AppendTooLarge {
        /// Encoded size of the append.
        size: u64,
        /// `max_bytes`.
        limit: u64,
    },

    /// `append` was called with no records.
    #[error("append of zero records")]
    EmptyAppend,

    /// An acknowledgement names a sequence number that was never made
    /// durable: a bug in the caller (acknowledging what it never read).
    #[error("acknowledgement of sequence {seq} beyond the last durable sequence {last}")]
    AckBeyondEnd {
        /// The acknowledged sequence number.
        seq: u64,
        /// The highest durable sequence number (0 when none).
        last: u64,
    },

    /// The buffer was closed (shutdown); no further appends, reads or
    /// acknowledgements are accepted.
    #[error("buffer is closed")]
    Closed,

    /// A listening socket could not be bound.
    #[error("{key} {addr}: {source}")]
    Listen {
        /// The configuration key of the address (`http.addr`).
        key: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// The uplink could not reach or keep talking to the cloud: connection
    /// refused or lost, TLS handshake failure, stream reset. Retrying later
    /// (after a backoff) can help.
    #[error("uplink {endpoint}: {reason}")]
    Uplink {
        /// The cloud endpoint (`grpc://host:port`, `quic://host:port`).
        endpoint: String,
        /// What went wrong.
        reason: String,
    },

    /// The cloud refused the gateway's credential (unknown or revoked API
    /// key, missing `ingest` scope, client certificate not accepted).
    /// Retrying the same credential fails the same way until an operator
    /// fixes it; the shipper keeps trying at its longest backoff.
    #[error("uplink {endpoint}: unauthorized: {reason}")]
    Unauthorized {
        /// The cloud endpoint.
        endpoint: String,
        /// The cloud's reason.
        reason: String,
    },

    /// The cloud answered outside the protocol (unexpected or malformed
    /// frame). Retrying on a new connection may help.
    #[error("uplink {endpoint}: protocol error: {reason}")]
    Protocol {
        /// The cloud endpoint.
        endpoint: String,
        /// What was wrong with the answer.
        reason: String,
    },

    /// The cloud did not answer in time.
    #[error("uplink {endpoint}: no answer to {what} within {after:?}")]
    Timeout {
        /// The cloud endpoint.
        endpoint: String,
        /// What was waited for (`connect`, `ack`).
        what: &'static str,
        /// How long.
        after: Duration,
    },
}

impl Error {
    /// Whether retrying the same operation later may succeed.
    ///
    /// True for I/O trouble (full or failing disk: space may come back) and
    /// for network trouble with the cloud; false for bad input, a closed
    /// buffer, bad configuration and a refused credential.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Io { .. }
            | Error::NotDurable { .. }
            | Error::Uplink { .. }
            | Error::Protocol { .. }
            | Error::Timeout { .. } => true,
            Error::InvalidConfig { .. }
            | Error::RecordTooLarge { .. }
            | Error::AppendTooLarge { .. }
            | Error::EmptyAppend
            | Error::AckBeyondEnd { .. }
            | Error::Closed
            | Error::Listen { .. }
            | Error::Unauthorized { .. } => false,
        }
    }

    /// Shorthand for [`Error::Io`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_split() {
        let io = Error::io("fsync", "/x", io::Error::other("EIO"));
        assert!(io.retryable());
        assert!(!Error::Closed.retryable());
        assert!(!Error::EmptyAppend.retryable());
        assert!(io.to_string().contains("fsync /x"));
    }
}
