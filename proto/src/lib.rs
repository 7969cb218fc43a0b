//! `opgraph-proto`: the one contract every Opgraph crate speaks.
//!
//! Module map, in the order data flows through it:
//!
//! - [`event`]: the canonical event envelope (interface spec 2.2) as Rust
//!   types: [`Event`], [`Party`], [`TrustTier`]. Their JSON form is the public
//!   envelope, byte for byte in meaning.
//! - [`validate`]: JSON in. [`Event::from_json`] parses and validates a body
//!   per the API contract's "Ingest" rules, naming the offending field in a
//!   [`ValidationError`]; the limits are the `MAX_*` constants.
//! - [`convert`]: protobuf in and out. [`Event::to_pb`] for producers;
//!   [`Event::from_pb`] for the cloud, which treats gRPC input as untrusted
//!   and runs it through the same validation as HTTP.
//! - [`pb`]: the generated `opgraph.v1` messages and the `Ingest` gRPC
//!   service (client and server), from `opgraph/v1/*.proto`.
//! - [`envelope`]: an ingest request body (one envelope or a batch of at
//!   most [`envelope::MAX_BATCH`], all or nothing), shared by the cloud's
//!   HTTP ingest and the gateway's local ingest endpoint.
//! - [`ids`]: `evt_...`-style ids (ULID-shaped) that cloud and gateway mint.
//! - [`encoded_batch`]: a `Batch` whose events stay encoded, as a gateway's
//!   buffer holds them, for the uplinks to send without decoding them.
//! - [`codec`]: the gRPC codec, which checks a batch's event count before
//!   decoding it ([`codec::MAX_BATCH_EVENTS`]).
//! - [`frame`]: the QUIC uplink's framing of those messages (kind, length,
//!   zstd-compressed batches), bounded against hostile peers.
//! - [`datetime`]: RFC 3339 date-times and calendar days, for device and
//!   provider times.
//! - [`error`]: [`ValidationError`], the validation error ([`frame`] has its
//!   own `FrameError`).
//!
//! No I/O and no clocks: callers pass the receive time (`now_ms`) in, also
//! to [`ids::new_id_at`].

pub mod codec;
pub mod convert;
pub mod datetime;
pub mod dir_lock;
pub mod encoded_batch;
pub mod envelope;
pub mod error;
pub mod event;
pub mod frame;
pub mod ids;
#[cfg(feature = "serve")]
pub mod serve;
pub mod validate;

/// Generated protobuf and gRPC code for package `opgraph.v1`.
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    tonic::include_proto!("opgraph.v1");
}

pub use error::{Result, ValidationError};
pub use event::{Event, JsonObject, Party, TrustTier};
pub use validate::{
    ENVELOPE_FIELDS, MAX_EVENT_NAME_LEN, MAX_FREE_OBJECT_BYTES, MAX_ID_LEN, MAX_PARTY_LEN,
    MAX_TIMESTAMP_AGE_MS, MAX_TIMESTAMP_LEAD_MS, value_fits_in,
};
