//! The serial protocol microcontroller firmware speaks to Opgraph.
//!
//! A device sends a [`Kind::Hello`] (who it is, and a boot id new at each
//! boot), then its readings, each a [`Kind::Reading`] frame numbered from 1
//! within the boot. The host stores them and answers with a cumulative
//! [`Kind::Ack`]; the device keeps every reading until an ack covers it and
//! sends again what stays unacknowledged, so a reading survives line noise,
//! a host restart and a lost ack. The host drops what it has seen already,
//! so a resend is never stored twice. `docs/firmware.md` has the whole
//! protocol, the device's obligations and a firmware example.
//!
//! - [`frame`]: frames, their encoder ([`FrameWriter`]) and the stream
//!   [`Decoder`], which resynchronises after any garbage;
//! - [`reading`]: the reading payload;
//! - `cobs` and [`crc`]: byte stuffing and the CRC-32 they rest on;
//! - `host` (feature `host`): the host's side of a line, I/O-free.
//!
//! Without the default `std` feature the crate is `no_std` and allocates
//! nothing: firmware links it as it is. The gateway's `firmware` source and
//! the `opgraph-firmware-bridge` binary (feature `bridge`: a serial port to
//! a gateway's local ingest endpoint) are the two hosts.
#![cfg_attr(not(feature = "std"), no_std)]

mod cobs;
pub mod crc;
pub mod frame;
#[cfg(feature = "host")]
pub mod host;
pub mod reading;

pub use frame::{Decoder, Frame, FrameWriter, Kind};
pub use reading::{Fields, Reading, Value};

/// What went wrong with a frame or a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The byte stuffing is broken (line noise, a cut frame).
    Stuffing,
    /// Longer than [`frame::MAX_FRAME`], or than the decoder's buffer.
    TooLong,
    /// Shorter than a header and a checksum.
    TooShort,
    /// The CRC-32 does not match.
    Checksum,
    /// A protocol version this crate does not speak.
    Version(u8),
    UnknownKind(u8),
    /// A payload that does not read as its kind says.
    Payload(&'static str),
    /// The output slice cannot hold the frame.
    BufferTooSmall,
}

impl Error {
    /// A short, fixed name for counting rejections by reason.
    pub const fn reason(&self) -> &'static str {
        match self {
            Error::Stuffing => "bad_stuffing",
            Error::TooLong => "frame_too_long",
            Error::TooShort => "frame_too_short",
            Error::Checksum => "bad_checksum",
            Error::Version(_) => "bad_version",
            Error::UnknownKind(_) => "unknown_kind",
            Error::Payload(_) => "bad_payload",
            Error::BufferTooSmall => "buffer_too_small",
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Stuffing => f.write_str("broken byte stuffing"),
            Error::TooLong => write!(f, "frame longer than {} bytes", frame::MAX_FRAME),
            Error::TooShort => f.write_str("frame shorter than a header and a checksum"),
            Error::Checksum => f.write_str("checksum mismatch"),
            Error::Version(v) => write!(f, "protocol version {v}, expected {}", frame::VERSION),
            Error::UnknownKind(k) => write!(f, "unknown frame kind 0x{k:02x}"),
            Error::Payload(why) => f.write_str(why),
            Error::BufferTooSmall => f.write_str("output buffer too small for the frame"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}
