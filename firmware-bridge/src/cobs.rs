//! Consistent Overhead Byte Stuffing: a frame is sent with every 0x00
//! replaced, then one 0x00 ends it. A receiver that joins mid-stream, or
//! loses bytes to line noise, is back in step at the next 0x00, and the
//! cost is one byte per 254.

use crate::Error;

/// Encodes into an output slice as the bytes arrive, so that a frame is
/// never assembled twice (firmware has little RAM to spare).
pub(crate) struct Encoder<'o> {
    out: &'o mut [u8],
    /// Where the current block's code byte goes.
    code_at: usize,
    code: u8,
    len: usize,
}

impl<'o> Encoder<'o> {
    pub(crate) fn new(out: &'o mut [u8]) -> Result<Self, Error> {
        if out.is_empty() {
            return Err(Error::BufferTooSmall);
        }
        Ok(Encoder { out, code_at: 0, code: 1, len: 1 })
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<(), Error> {
        for &b in bytes {
            if b == 0 {
                self.close_block()?;
                continue;
            }
            *self.out.get_mut(self.len).ok_or(Error::BufferTooSmall)? = b;
            self.len += 1;
            self.code += 1;
            if self.code == 0xFF {
                self.close_block()?;
            }
        }
        Ok(())
    }

    fn close_block(&mut self) -> Result<(), Error> {
        self.out[self.code_at] = self.code;
        self.code_at = self.len;
        // Reserve the next block's code byte.
        if self.len >= self.out.len() {
            return Err(Error::BufferTooSmall);
        }
        self.len += 1;
        self.code = 1;
        Ok(())
    }

    /// Closes the last block and appends the 0x00 delimiter: the number of
    /// bytes written.
    pub(crate) fn finish(self) -> Result<usize, Error> {
        self.out[self.code_at] = self.code;
        *self.out.get_mut(self.len).ok_or(Error::BufferTooSmall)? = 0;
        Ok(self.len + 1)
    }
}

/// Decodes `buf` (one frame, without its delimiter) in place: the length of
/// the decoded frame at the start of `buf`.
pub(crate) fn decode_in_place(buf: &mut [u8]) -> Result<usize, Error> {
    let (mut read, mut write) = (0, 0);
    while read < buf.len() {
        let code = buf[read];
        if code == 0 {
            return Err(Error::Stuffing);
        }
        let end = read + usize::from(code);
        if end > buf.len() {
            return Err(Error::Stuffing);
        }
        read += 1;
        while read < end {
            if buf[read] == 0 {
                return Err(Error::Stuffing);
            }
            buf[write] = buf[read];
            read += 1;
            write += 1;
        }
        // A block shorter than the longest ends with a zero, unless it is
        // the last one.
        if code < 0xFF && read < buf.len() {
            buf[write] = 0;
            write += 1;
        }
    }
    Ok(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(input: &[u8]) -> ([u8; 600], usize) {
        let mut out = [0u8; 600];
        let mut e = Encoder::new(&mut out).unwrap();
        e.push(input).unwrap();
        let n = e.finish().unwrap();
        (out, n)
    }

    #[test]
    fn known_encodings() {
        // Examples of the COBS paper (Cheshire and Baker, 1999) and its
        // common test vectors, each with our delimiter.
        let cases: [(&[u8], &[u8]); 5] = [
            (&[0x00], &[0x01, 0x01, 0x00]),
            (&[0x00, 0x00], &[0x01, 0x01, 0x01, 0x00]),
            (&[0x11, 0x22, 0x00, 0x33], &[0x03, 0x11, 0x22, 0x02, 0x33, 0x00]),
            (&[0x11, 0x22, 0x33, 0x44], &[0x05, 0x11, 0x22, 0x33, 0x44, 0x00]),
            (&[0x11, 0x00, 0x00, 0x00], &[0x02, 0x11, 0x01, 0x01, 0x01, 0x00]),
        ];
        for (input, expected) in cases {
            let (out, n) = encode(input);
            assert_eq!(&out[..n], expected, "{input:02x?}");
            let mut frame = out[..n - 1].to_vec();
            let m = decode_in_place(&mut frame).unwrap();
            assert_eq!(&frame[..m], input);
        }
    }

    #[test]
    fn long_runs_without_zero_split_into_blocks() {
        let input: Vec<u8> = (0..600u32).map(|i| (i % 255 + 1) as u8).collect();
        let mut out = [0u8; 700];
        let mut e = Encoder::new(&mut out).unwrap();
        e.push(&input).unwrap();
        let n = e.finish().unwrap();
        assert_eq!(out[0], 0xFF);
        assert!(!out[..n - 1].contains(&0), "no zero inside a frame");
        let mut frame = out[..n - 1].to_vec();
        let m = decode_in_place(&mut frame).unwrap();
        assert_eq!(&frame[..m], &input[..]);
    }

    #[test]
    fn a_small_buffer_and_bad_stuffing_are_errors() {
        let mut out = [0u8; 4];
        let mut e = Encoder::new(&mut out).unwrap();
        assert!(matches!(e.push(&[1, 2, 3, 4, 5]), Err(Error::BufferTooSmall)));
        assert!(matches!(decode_in_place(&mut [0x05, 0x11]), Err(Error::Stuffing)));
        assert!(matches!(decode_in_place(&mut [0x02, 0x11, 0x00]), Err(Error::Stuffing)));
    }
}
