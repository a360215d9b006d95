//! HTTP/2 frames as bytes (RFC 9113 section 4.1): the connection preface, the 9-byte frame header, and the frame
//! types and flags that the node front (which follows an instance's frames to insert a GOAWAY) and the CSI plugin
//! (which rewrites the kubelet's header blocks) read. Neither decodes more than headers: h2 does the rest.

/// What every HTTP/2 client sends first (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The length of a frame header.
pub const HEADER_LEN: usize = 9;

/// Frame type HEADERS.
pub const HEADERS: u8 = 0x1;
/// Frame type PUSH_PROMISE.
pub const PUSH_PROMISE: u8 = 0x5;
/// Frame type GOAWAY.
pub const GOAWAY: u8 = 0x7;
/// Frame type CONTINUATION.
pub const CONTINUATION: u8 = 0x9;

/// Flag END_STREAM (HEADERS, DATA).
pub const END_STREAM: u8 = 0x1;
/// Flag END_HEADERS (HEADERS, PUSH_PROMISE, CONTINUATION).
pub const END_HEADERS: u8 = 0x4;
/// Flag PADDED (HEADERS, DATA, PUSH_PROMISE).
pub const PADDED: u8 = 0x8;
/// Flag PRIORITY (HEADERS).
pub const PRIORITY: u8 = 0x20;

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The payload's length (24 bits).
    pub len: u32,
    /// The frame type.
    pub kind: u8,
    /// The flags.
    pub flags: u8,
    /// The stream identifier, as sent (its reserved bit included).
    pub stream: [u8; 4],
}

impl Header {
    /// Reads a frame header.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: [b[5], b[6], b[7], b[8]],
        }
    }

    /// Reads the frame header at the start of `bytes`, if they hold one.
    pub fn read(bytes: &[u8]) -> Option<Header> {
        bytes.first_chunk::<HEADER_LEN>().map(Header::parse)
    }

    /// Appends this header to `out` (`len` must fit in 24 bits).
    pub fn write(&self, out: &mut Vec<u8>) {
        debug_assert!(self.len < 1 << 24);
        out.extend_from_slice(&self.len.to_be_bytes()[1..]);
        out.extend_from_slice(&[self.kind, self.flags]);
        out.extend_from_slice(&self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_what_was_written() {
        let h = Header {
            len: 0x01_02_03,
            kind: CONTINUATION,
            flags: END_HEADERS,
            stream: [0x80, 0, 0, 5],
        };
        let mut out = Vec::new();
        h.write(&mut out);
        assert_eq!(out, [1, 2, 3, 9, 4, 0x80, 0, 0, 5]);
        assert_eq!(Header::read(&out), Some(h));
        assert_eq!(Header::read(&out[..8]), None);
    }
}
