//! `opgraph-cloud`: receives events, stores them, and serves the API.
//!
//! How a request flows:
//!
//! - [`server`] loads nothing itself: it takes a [`config::Config`], opens
//!   the store, makes sure a first workspace and key exist (bootstrap),
//!   binds the listeners and runs until told to stop.
//! - [`api`] is the HTTP surface: its extractors turn the `Authorization`
//!   header into an [`auth::Principal`] (via [`auth`]), apply the
//!   workspace's rate limit ([`usage`]) and read JSON bodies with their
//!   limits; one file per group of endpoints; errors become responses in
//!   exactly one place ([`error`]).
//! - [`store`] is the seam to storage: every call is scoped to a workspace;
//!   [`store::embedded`] is the SQLite default.
//! - [`receiver`] takes gateway batches over gRPC and QUIC and commits
//!   them exactly once, answering with cumulative acknowledgements.
//! - [`governance`] is the I/O-free core of the governance layer
//!   (decision statuses, enforcement rules, receipt hashing and chains,
//!   Merkle proofs); `api::{governance, enforce, proofs}` drive it through
//!   the store's `GovernanceStore` part.
//! - [`trackables`] (kinds, codes, URL checks, QR codes) and
//!   [`connectors`] (provider records to events) are I/O-free cores that
//!   `api::trackables`, `api::scan` and `api::connectors` drive through
//!   the store's `TrackableStore` and `ConnectorStore` parts.
//! - [`intelligence`] is the I/O-free core of the query API's judgements
//!   (period diff, anomalies, health score, next actions) over the
//!   aggregates of the store's `QueryStore` part, which
//!   `api::{metrics, queries, intelligence, graphql}` drive.
//! - [`outbound`] makes one HTTPS `POST` to a customer's endpoint: proof
//!   trails pushed to the external proof service, destination exports
//!   ([`sigv4`] signs those to S3).
//! - [`telemetry`] holds the Prometheus metrics; [`ids`] makes identifiers.
//! - [`cli`] is the `opgraph` client: commands and the MCP server over
//!   the HTTP API, sharing nothing with the server but this crate.

pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod connectors;
pub mod error;
pub mod governance;
pub mod ids;
pub mod intelligence;
pub mod outbound;
pub mod receiver;
pub mod server;
pub mod sigv4;
pub mod store;
pub mod telemetry;
pub mod tls_client;
pub mod trackables;
pub mod usage;
pub mod webhooks;

/// Milliseconds since the Unix epoch, the unit of every time in the API.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
