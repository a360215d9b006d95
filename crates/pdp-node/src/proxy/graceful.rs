//! Just enough HTTP for the front to move a connection without failing a call: telling HTTP/2 and HTTP/1.1
//! clients by their first bytes, following the instance's HTTP/2 frame boundaries, the GOAWAY frame the front
//! writes between two of them, and the `Connection: close` it adds to an HTTP/1.1 answer.
//!
//! Why: closing a connection, even one quiet after an answer, can cross a request the client is sending at that
//! instant, and the client then sees the connection lost with its call under way (Go's client, for one, does
//! not retry a POST). Both protocols have a graceful way, which the front uses when a connection is to go:
//! - HTTP/2: a GOAWAY tells the client to open no new stream on the connection, while the streams it has
//!   opened are still answered. The front's names the last possible stream id (as a server's graceful
//!   shutdown does first, RFC 9113 section 6.8), so every stream the client opened before reading it is
//!   answered by the instance it went to.
//! - HTTP/1.1: `Connection: close` in an answer tells the client to send nothing more on the connection and
//!   close it once the answer is read (RFC 9112 section 9.6). The front adds it to the next answer: the first
//!   bytes the instance sends after the client sent some, if they start a final HTTP/1.1 status line. That
//!   assumes one request at a time, as the clients of Go, gRPC, curl and browsers send them; a pipelining
//!   client (several requests before the first answer) could get it in an answer after which it already sent
//!   more, and must send those again, as RFC 9112 says a client must after any close.
//!
//! Either way the client's next call goes on a new connection, to the newest instance.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use pdp_core::h2frame::{
    CONTINUATION, END_HEADERS, GOAWAY, HEADER_LEN, HEADERS, Header, PREFACE, PUSH_PROMISE,
};

const UNDECIDED_MAX: u8 = PREFACE.len() as u8;
const H2: u8 = 100;
const H1: u8 = 101;
const OTHER: u8 = 102;

/// What one connection's client speaks, from its first bytes, and where its HTTP/1.1 exchanges are.
pub(super) struct Wire {
    /// Preface bytes matched so far (0..24), or the verdict.
    state: AtomicU8,
    /// The client sent bytes since the instance last answered: the next answer's bytes start a response.
    asked: AtomicBool,
    /// The front has sent the client what tells it to go (a GOAWAY, or an answer with `Connection: close`).
    told: AtomicBool,
}

impl Wire {
    pub(super) fn new() -> Self {
        Self {
            state: AtomicU8::new(0),
            asked: AtomicBool::new(false),
            told: AtomicBool::new(false),
        }
    }

    /// Bytes the client sent, in order.
    pub(super) fn client_sent(&self, bytes: &[u8]) {
        self.asked.store(true, Ordering::Relaxed);
        let matched = self.state.load(Ordering::Relaxed);
        if matched >= UNDECIDED_MAX {
            return;
        }
        let at = matched as usize;
        let n = bytes.len().min(PREFACE.len() - at);
        let next = if bytes[..n] != PREFACE[at..at + n] {
            // An HTTP/1.1 request starts with its method, a token in capitals (the preface's own `P` included).
            let first = if at > 0 { PREFACE[0] } else { bytes[0] };
            if first.is_ascii_uppercase() {
                H1
            } else {
                OTHER
            }
        } else if at + n == PREFACE.len() {
            H2
        } else {
            (at + n) as u8
        };
        self.state.store(next, Ordering::Relaxed);
    }

    /// Whether the client sent bytes since the last call (and clears it): called with each answer's bytes.
    pub(super) fn take_asked(&self) -> bool {
        self.asked.swap(false, Ordering::Relaxed)
    }

    /// The whole HTTP/2 preface came first.
    pub(super) fn is_h2(&self) -> bool {
        self.state.load(Ordering::Relaxed) == H2
    }

    /// The first bytes looked like an HTTP/1.1 request.
    pub(super) fn is_h1(&self) -> bool {
        self.state.load(Ordering::Relaxed) == H1
    }

    /// The first bytes were neither (TLS the front does not terminate, another protocol).
    pub(super) fn is_other(&self) -> bool {
        self.state.load(Ordering::Relaxed) == OTHER
    }

    /// The client was told to go.
    pub(super) fn was_told(&self) -> bool {
        self.told.load(Ordering::Relaxed)
    }

    pub(super) fn mark_told(&self) {
        self.told.store(true, Ordering::Relaxed);
    }
}

/// Where the instance's HTTP/2 byte stream is, frame by frame: a frame may only be inserted between two frames,
/// and not inside a header block (a HEADERS or PUSH_PROMISE without END_HEADERS must be followed by its
/// CONTINUATION frames and nothing else). Once the instance has sent a GOAWAY of its own, the front sends none:
/// the last stream id of a later GOAWAY must not be higher (RFC 9113 section 6.8), and gRPC-Go closes the
/// connection, calls under way included, when it is.
#[derive(Debug, Default)]
pub(super) struct Frames {
    header: [u8; HEADER_LEN],
    /// Bytes of the current frame header seen so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: u32,
    in_header_block: bool,
    /// A whole frame went by: the server's preface (its SETTINGS) is out, so a frame may follow.
    seen: bool,
    /// The instance sent a GOAWAY.
    went_away: bool,
}

impl Frames {
    /// Bytes the instance sent, in order.
    pub(super) fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            bytes = &bytes[self.step(bytes)..];
        }
    }

    /// Like [`Frames::advance`], but stops at the first place in `bytes` where a frame may be inserted (see
    /// [`Frames::may_insert`]) and returns its offset; the bytes after it are not advanced over. `None` when there
    /// is none in `bytes` (all of them were advanced over).
    pub(super) fn advance_to_gap(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut at = 0;
        while at < bytes.len() {
            at += self.step(&bytes[at..]);
            if self.may_insert() {
                return Some(at);
            }
        }
        None
    }

    /// Advances over the rest of the current frame header, or of its payload, within `bytes`; returns how many
    /// bytes that took (at least one, `bytes` being non-empty).
    fn step(&mut self, bytes: &[u8]) -> usize {
        if self.left > 0 {
            let k = bytes.len().min(self.left as usize);
            self.left -= k as u32;
            return k;
        }
        let k = bytes.len().min(HEADER_LEN - self.have);
        self.header[self.have..self.have + k].copy_from_slice(&bytes[..k]);
        self.have += k;
        if self.have == HEADER_LEN {
            let head = Header::parse(&self.header);
            self.left = head.len;
            match head.kind {
                HEADERS | PUSH_PROMISE | CONTINUATION => {
                    self.in_header_block = head.flags & END_HEADERS == 0
                }
                GOAWAY => self.went_away = true,
                _ => {}
            }
            self.have = 0;
            self.seen = true;
        }
        k
    }

    /// Whether a frame written now lands between two of the instance's frames, outside a header block.
    pub(super) fn between(&self) -> bool {
        self.seen && self.have == 0 && self.left == 0 && !self.in_header_block
    }

    /// Whether the front's GOAWAY may be written now: between two frames, and the instance has sent none.
    pub(super) fn may_insert(&self) -> bool {
        self.between() && !self.went_away
    }

    /// The instance has told the client to go itself.
    pub(super) fn went_away(&self) -> bool {
        self.went_away
    }
}

/// Why a connection is told to go: the GOAWAY's debug data, which clients log.
pub(super) const MOVED: &str = "pdp-node-front: a newer PDP instance serves";
pub(super) const AGED: &str = "pdp-node-front: max connection age";
pub(super) const DRAINING: &str = "pdp-node-front: draining";

/// A GOAWAY frame: no error, last stream id 2^31-1 (every stream the client opened so far will be answered),
/// `debug` as its debug data.
pub(super) fn goaway(debug: &str) -> Vec<u8> {
    let len = 8 + debug.len() as u32;
    let mut frame = Vec::with_capacity(HEADER_LEN + len as usize);
    Header {
        len,
        kind: GOAWAY,
        flags: 0,
        stream: [0; 4],
    }
    .write(&mut frame);
    frame.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
    frame.extend_from_slice(&0u32.to_be_bytes());
    frame.extend_from_slice(debug.as_bytes());
    frame
}

/// The header line the front adds to an HTTP/1.1 answer.
pub(super) const CONNECTION_CLOSE: &[u8] = b"Connection: close\r\n";

/// Where `Connection: close` goes in `answer`, the first bytes the instance sent after a request: right after
/// the status line, when they start a final HTTP/1.1 response (status 2xx to 5xx) whose status line is whole.
/// `None` otherwise (an interim 100 Continue, HTTP/1.0, a status line split over two reads): the front then
/// waits for the next answer.
pub(super) fn after_status_line(answer: &[u8]) -> Option<usize> {
    const VERSION: &[u8] = b"HTTP/1.1 ";
    let status = *answer.get(VERSION.len())?;
    if !answer.starts_with(VERSION) || !(b'2'..=b'5').contains(&status) {
        return None;
    }
    // A status line is short; one far longer is not one the front understands.
    let line = &answer[..answer.len().min(256)];
    line.windows(2).position(|w| w == b"\r\n").map(|at| at + 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn the_client_is_told_by_its_first_bytes_in_pieces() {
        for split in 0..PREFACE.len() {
            let w = Wire::new();
            w.client_sent(&PREFACE[..split]);
            assert!(!w.is_h2() && !w.is_h1() && !w.is_other());
            w.client_sent(&[&PREFACE[split..], b"\0\0\x12\x04".as_slice()].concat());
            assert!(w.is_h2(), "split at {split}");
        }
        for (first, h1) in [
            (&b"POST /api/check/resources HTTP/1.1\r\n"[..], true),
            (b"GET / HTTP/1.1\r\n", true),
            (b"PRI * HTTP/2.0\r\n\r\nXX", true),
            (b"\x16\x03\x01\x02\x00", false),
            (b"a\n", false),
        ] {
            let w = Wire::new();
            for piece in first.chunks(3) {
                w.client_sent(piece);
            }
            assert_eq!(
                (w.is_h1(), w.is_other(), w.is_h2()),
                (h1, !h1, false),
                "{first:?}"
            );
            // Decided once: later bytes change nothing.
            w.client_sent(&PREFACE[..]);
            assert!(!w.is_h2());
        }
    }

    #[test]
    fn asked_is_set_by_the_client_and_taken_by_each_answer() {
        let w = Wire::new();
        assert!(!w.take_asked());
        w.client_sent(b"POST / HTTP/1.1\r\n");
        assert!(w.take_asked());
        assert!(!w.take_asked(), "the rest of the same answer");
    }

    #[test]
    fn a_frame_is_inserted_only_between_frames_and_outside_a_header_block() {
        let mut f = Frames::default();
        assert!(!f.between(), "before the server's preface");
        let settings = frame(0x4, 0, &[0, 3, 0, 0, 0, 100]);
        f.advance(&settings[..4]);
        assert!(!f.between(), "inside a frame header");
        f.advance(&settings[4..10]);
        assert!(!f.between(), "inside a payload");
        f.advance(&settings[10..]);
        assert!(f.between());

        // A header block split over HEADERS and two CONTINUATIONs, fed a byte at a time.
        let block = [
            frame(HEADERS, 0, b"abc"),
            frame(CONTINUATION, 0, b"de"),
            frame(CONTINUATION, END_HEADERS, b"f"),
        ];
        for (i, part) in block.iter().enumerate() {
            for b in part {
                f.advance(std::slice::from_ref(b));
            }
            assert_eq!(f.between(), i == 2, "after frame {i}");
        }
        let mut all = frame(HEADERS, END_HEADERS, b"hdr");
        all.extend(frame(0x0, 0x1, &[7; 5000]));
        all.extend(frame(PUSH_PROMISE, 0, b"pp"));
        f.advance(&all);
        assert!(!f.between(), "a PUSH_PROMISE without END_HEADERS");
        f.advance(&frame(CONTINUATION, END_HEADERS, b""));
        assert!(f.between());
        // An empty frame (a SETTINGS ack) ends at its header.
        f.advance(&frame(0x4, 0x1, b""));
        assert!(f.between());
    }

    #[test]
    fn the_first_gap_in_a_read_is_found_and_none_after_the_instances_own_goaway() {
        let mut f = Frames::default();
        let mut read = frame(0x4, 0, b"");
        read.extend(frame(HEADERS, 0, b"ab"));
        read.extend(frame(CONTINUATION, END_HEADERS, b"c"));
        read.extend(frame(0x0, 0x1, b"body"));
        // After the SETTINGS (9 bytes) comes the first gap; the header block is not one.
        assert_eq!(f.advance_to_gap(&read), Some(9));
        assert_eq!(f.advance_to_gap(&read[9..]), Some(11 + 10));
        assert_eq!(f.advance_to_gap(&read[30..]), Some(13));
        assert_eq!(f.advance_to_gap(&frame(0x0, 0, b"12345")[..11]), None);
        assert_eq!(f.advance_to_gap(b"345"), Some(3));
        // The instance's GOAWAY: no gap after it, ever.
        let mut read = goaway("instance");
        read.extend(frame(0x0, 0x1, b"more"));
        assert_eq!(f.advance_to_gap(&read), None);
        assert!(f.went_away() && f.between() && !f.may_insert());
    }

    #[test]
    fn the_goaway_frame_is_well_formed() {
        let g = goaway("moved");
        assert_eq!(g.len(), 9 + 8 + 5);
        assert_eq!(&g[..9], &[0, 0, 13, 0x7, 0, 0, 0, 0, 0]);
        assert_eq!(&g[9..13], &[0x7f, 0xff, 0xff, 0xff]);
        assert_eq!(&g[13..17], &[0, 0, 0, 0]);
        assert_eq!(&g[17..], b"moved");
        let mut f = Frames::default();
        f.advance(&g);
        assert!(f.between());
    }

    #[test]
    fn connection_close_goes_after_a_final_status_line_only() {
        assert_eq!(
            after_status_line(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
            Some(17)
        );
        assert_eq!(
            after_status_line(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(34)
        );
        for not in [
            &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
            b"HTTP/1.0 200 OK\r\n",
            b"HTTP/1.1 200 O",
            b"HTTP/1.1 ",
            b"HTTP/1.1",
            b"",
            b"{\"results\":[]}\r\n",
        ] {
            assert_eq!(after_status_line(not), None, "{not:?}");
        }
        let long = [b"HTTP/1.1 200 ".as_slice(), &[b'x'; 300], b"\r\n"].concat();
        assert_eq!(after_status_line(&long), None);
    }
}
