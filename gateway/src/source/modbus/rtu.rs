//! Modbus RTU framing the gateway needs beside tokio-modbus: the length of
//! a reply and its CRC, so that a reply with a wrong CRC is counted. The
//! tokio-modbus client only logs such a frame, skips its bytes and waits
//! for a valid one, which ends in a timeout; [`CrcTap`] sits between it and
//! the serial port and counts the wrong CRC first. The simulator uses the
//! same functions to garble its replies on request.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest RTU frame.
const MAX_FRAME: usize = 256;

/// CRC-16/MODBUS of `bytes` (polynomial 0xA001 reflected, initial 0xFFFF);
/// on the wire low byte first.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0xFFFFu16;
    for &b in bytes {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
        }
    }
    crc
}

/// The length of the reply frame at the start of `buf` (unit, function,
/// data, CRC), once enough of it has arrived to tell; `None` before.
/// Exceptions are 5 bytes, reads carry a byte count, writes echo 6 bytes.
pub fn reply_len(buf: &[u8]) -> Option<usize> {
    announced_len(buf).filter(|len| buf.len() >= *len)
}

/// The length the start of `buf` announces for its frame, which may be
/// more than has arrived, or (a garbled byte count) than any frame.
fn announced_len(buf: &[u8]) -> Option<usize> {
    let function = *buf.get(1)?;
    let len = if function & 0x80 != 0 {
        5
    } else {
        match function {
            1..=4 => 5 + usize::from(*buf.get(2)?),
            5 | 6 | 15 | 16 => 8,
            // Unknown: whatever has arrived is taken as the frame.
            _ => buf.len(),
        }
    };
    Some(len)
}

/// Whether a whole frame's trailing CRC matches its contents.
pub fn crc_ok(frame: &[u8]) -> bool {
    match frame.len().checked_sub(2) {
        Some(body) if body > 0 => {
            crc16(&frame[..body]) == u16::from_le_bytes([frame[body], frame[body + 1]])
        }
        _ => false,
    }
}

/// A serial port that counts replies with a wrong CRC into `crc_errors`:
/// each write is a new request, and the first frame read after it is
/// checked once.
pub struct CrcTap<T> {
    inner: T,
    reply: Vec<u8>,
    checked: bool,
    crc_errors: Arc<AtomicU64>,
}

impl<T> CrcTap<T> {
    pub fn new(inner: T, crc_errors: Arc<AtomicU64>) -> Self {
        CrcTap { inner, reply: Vec::with_capacity(MAX_FRAME), checked: false, crc_errors }
    }

    fn observe(&mut self, bytes: &[u8]) {
        if self.checked {
            return;
        }
        let room = MAX_FRAME.saturating_sub(self.reply.len());
        self.reply.extend_from_slice(&bytes[..bytes.len().min(room)]);
        let wrong = match announced_len(&self.reply) {
            // A byte count of 252 to 255: no CRC could make it a frame.
            Some(len) if len > MAX_FRAME => true,
            Some(len) if self.reply.len() >= len => !crc_ok(&self.reply[..len]),
            _ => return,
        };
        self.checked = true;
        if wrong {
            self.crc_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for CrcTap<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrcTap").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CrcTap<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = buf.filled()[before..].to_vec();
            self.observe(&new);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CrcTap<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // A request: its reply is the next frame read.
        self.reply.clear();
        self.checked = false;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Read holding register 0 of unit 1, answered with the value 0x002A.
    fn reply() -> Vec<u8> {
        let mut frame = vec![0x01, 0x03, 0x02, 0x00, 0x2A];
        let crc = crc16(&frame);
        frame.extend_from_slice(&crc.to_le_bytes());
        frame
    }

    #[test]
    fn crc_and_lengths_match_the_protocol() {
        // The classic example: 01 03 00 00 00 0A -> CRC C5CD (CD C5 on the wire).
        assert_eq!(crc16(&[0x01, 0x03, 0x00, 0x00, 0x00, 0x0A]), 0xCDC5);
        let frame = reply();
        assert!(crc_ok(&frame));
        let mut bad = frame.clone();
        bad[6] ^= 0xFF;
        assert!(!crc_ok(&bad));
        assert!(!crc_ok(&[0x01]));
        assert_eq!(reply_len(&frame), Some(7));
        assert_eq!(reply_len(&frame[..4]), None);
        assert_eq!(reply_len(&[0x01, 0x83, 0x02, 0, 0]), Some(5));
        assert_eq!(reply_len(&[0x01, 0x06, 0, 1, 0, 3, 0, 0]), Some(8));
    }

    #[tokio::test]
    async fn a_byte_count_no_frame_can_hold_is_counted_at_once() {
        let (ours, mut device) = tokio::io::duplex(1024);
        let errors = Arc::new(AtomicU64::new(0));
        let mut tap = CrcTap::new(ours, Arc::clone(&errors));
        tap.write_all(&[0x01, 0x03, 0, 0, 0, 1, 0x84, 0x0A]).await.unwrap();
        // 5 + 253 bytes announced, past the 256 a frame may have.
        device.write_all(&[0x01, 0x03, 253, 0x00]).await.unwrap();
        let mut read = [0u8; 64];
        assert_eq!(tap.read(&mut read).await.unwrap(), 4);
        assert_eq!(errors.load(Ordering::Relaxed), 1);
        // Counted once, whatever else arrives.
        device.write_all(&[0u8; 300]).await.unwrap();
        let mut rest = 0;
        while rest < 300 {
            rest += tap.read(&mut read).await.unwrap();
        }
        assert_eq!(errors.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn the_tap_counts_a_reply_with_a_wrong_crc_once() {
        let (ours, mut device) = tokio::io::duplex(1024);
        let errors = Arc::new(AtomicU64::new(0));
        let mut tap = CrcTap::new(ours, Arc::clone(&errors));
        let mut read = [0u8; 64];
        for (i, garble) in [false, true, false, true].into_iter().enumerate() {
            tap.write_all(&[0x01, 0x03, 0, 0, 0, 1, 0x84, 0x0A]).await.unwrap();
            let mut request = [0u8; 8];
            device.read_exact(&mut request).await.unwrap();
            let mut frame = reply();
            if garble {
                frame[6] ^= 0x55;
            }
            // In two pieces, as a serial line delivers it.
            device.write_all(&frame[..3]).await.unwrap();
            let n = tap.read(&mut read).await.unwrap();
            device.write_all(&frame[3..]).await.unwrap();
            let mut got = n;
            while got < frame.len() {
                got += tap.read(&mut read[got..]).await.unwrap();
            }
            assert_eq!(&read[..got], &frame[..], "round {i}");
        }
        assert_eq!(errors.load(Ordering::Relaxed), 2);
    }
}
