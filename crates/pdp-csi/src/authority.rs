//! The kubelet's gRPC client (grpc-go up to at least 1.4x, as in Kubernetes 1.20) sends the Unix socket's path as
//! the HTTP/2 `:authority` (`/var/lib/kubelet/plugins_registry/...sock`). That is not a valid authority, and the
//! h2 crate under tonic refuses the request with a stream reset (PROTOCOL_ERROR; hyperium/h2#487 is still open).
//! So every connection the plugin accepts goes through [`FixAuthority`], which rewrites, in the client's header
//! blocks, the value of each `:authority` field to `localhost` before h2 reads them. Nothing else of the stream
//! changes.
//!
//! **How, without an HPACK decoder.** A header block is a sequence of field representations (RFC 7541 §6); each
//! can be walked with integer decoding alone, skipping string bytes (Huffman-coded or not) by their length. A
//! field whose name is `:authority` (static table index 1, or that literal name) gets its value string replaced
//! by the plain string `localhost`, keeping its representation (with incremental indexing, without, never
//! indexed). The server's dynamic table then holds `localhost` where the client's holds the path, at the same
//! position; the entry is smaller, so the server evicts no earlier than the client and every index the client
//! sends names the same entry on both sides. A field that names `:authority` by a dynamic-table index is left
//! alone (grpc-go always names it by the static index).
//!
//! Frames are rewritten only while their header block is being collected (HEADERS, then CONTINUATION until
//! END_HEADERS); the rewritten block goes out as one HEADERS frame and, past the default 16 KiB frame size, its
//! CONTINUATION frames. Padding is dropped (it carries nothing); priority fields are kept.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use pdp_core::h2frame::{
    CONTINUATION, END_HEADERS, END_STREAM, HEADER_LEN, HEADERS, Header, PADDED, PREFACE, PRIORITY,
};

/// What replaces the client's `:authority`.
const AUTHORITY: &[u8] = b"localhost";

/// The largest frame payload written (SETTINGS_MAX_FRAME_SIZE's initial value, which the server accepts).
const MAX_FRAME: usize = 16_384;

/// The largest header block collected (a request's headers are small; a client that sends more is cut off).
const MAX_BLOCK: usize = 256 * 1024;

/// Why a header block cannot be walked.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(&'static str);

fn invalid(why: &'static str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 from the client: {why}"),
    )
}

/// Decodes an HPACK integer with an `n`-bit prefix at `at`; returns it and the position after it.
fn integer(block: &[u8], at: usize, n: u32) -> Result<(usize, usize), Malformed> {
    let first = *block.get(at).ok_or(Malformed("truncated integer"))?;
    let mask = (1usize << n) - 1;
    let mut value = usize::from(first) & mask;
    let mut at = at + 1;
    if value < mask {
        return Ok((value, at));
    }
    let mut shift = 0u32;
    loop {
        let b = *block.get(at).ok_or(Malformed("truncated integer"))?;
        at += 1;
        if shift > 28 {
            return Err(Malformed("integer too large"));
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok((value, at));
        }
    }
}

/// The string at `at`: (is it Huffman-coded, its bytes, the position after it).
fn string(block: &[u8], at: usize) -> Result<(bool, &[u8], usize), Malformed> {
    let huffman = block.get(at).ok_or(Malformed("truncated string"))? & 0x80 != 0;
    let (len, start) = integer(block, at, 7)?;
    let end = start
        .checked_add(len)
        .filter(|e| *e <= block.len())
        .ok_or(Malformed("truncated string"))?;
    Ok((huffman, &block[start..end], end))
}

/// The header block with every `:authority` value replaced by `localhost` (see the module docs).
pub fn rewrite_block(block: &[u8]) -> Result<Vec<u8>, Malformed> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    while at < block.len() {
        let b = block[at];
        let (prefix_bits, literal) = match b {
            _ if b & 0x80 != 0 => (7, false),    // indexed field
            _ if b & 0xc0 == 0x40 => (6, true),  // literal, incremental indexing
            _ if b & 0xe0 == 0x20 => (5, false), // dynamic table size update
            _ => (4, true),                      // literal without indexing, or never indexed
        };
        let (index, after) = integer(block, at, prefix_bits)?;
        if !literal {
            out.extend_from_slice(&block[at..after]);
            at = after;
            continue;
        }
        let (authority, name_end) = if index == 0 {
            let (huffman, name, end) = string(block, after)?;
            (!huffman && name == b":authority", end)
        } else {
            (index == 1, after)
        };
        let (_, _, value_end) = string(block, name_end)?;
        out.extend_from_slice(&block[at..name_end]);
        if authority {
            out.push(AUTHORITY.len() as u8);
            out.extend_from_slice(AUTHORITY);
        } else {
            out.extend_from_slice(&block[name_end..value_end]);
        }
        at = value_end;
    }
    Ok(out)
}

/// A header block being collected: the HEADERS frame's stream, flags and priority fields, and the fragments.
struct Pending {
    stream: [u8; 4],
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// Rewrites the client's header blocks on their way in (the read side); the write side passes through.
pub struct FixAuthority<S> {
    inner: S,
    /// Bytes read from the client, not yet rewritten (an incomplete frame).
    input: Vec<u8>,
    /// Rewritten bytes not yet handed to the reader.
    output: Vec<u8>,
    /// How many bytes of `output` were handed out already.
    taken: usize,
    preface_seen: bool,
    pending: Option<Pending>,
    eof: bool,
}

impl<S> FixAuthority<S> {
    /// Wraps a connection from a client.
    pub fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            input: Vec::new(),
            output: Vec::new(),
            taken: 0,
            preface_seen: false,
            pending: None,
            eof: false,
        }
    }

    /// Moves every complete frame of `input` to `output`, rewritten where it carries a header block.
    fn process(&mut self) -> io::Result<()> {
        if !self.preface_seen {
            if self.input.len() < PREFACE.len() {
                return Ok(());
            }
            if &self.input[..PREFACE.len()] != PREFACE {
                return Err(invalid("no HTTP/2 connection preface"));
            }
            self.output.extend_from_slice(PREFACE);
            self.input.drain(..PREFACE.len());
            self.preface_seen = true;
        }
        let mut at = 0;
        while let Some(head) = Header::read(&self.input[at..]) {
            let len = head.len as usize;
            if self.input.len() - at < HEADER_LEN + len {
                break;
            }
            let Header {
                kind,
                flags,
                stream,
                ..
            } = head;
            let payload = &self.input[at + HEADER_LEN..at + HEADER_LEN + len];
            match (kind, self.pending.is_some()) {
                (HEADERS, false) => {
                    let mut body = payload;
                    let mut pad = 0;
                    if flags & PADDED != 0 {
                        pad = usize::from(
                            *body.first().ok_or_else(|| invalid("empty padded frame"))?,
                        );
                        body = &body[1..];
                    }
                    let mut priority = None;
                    if flags & PRIORITY != 0 {
                        let p: [u8; 5] = body
                            .get(..5)
                            .and_then(|p| p.try_into().ok())
                            .ok_or_else(|| invalid("short priority fields"))?;
                        priority = Some(p);
                        body = &body[5..];
                    }
                    let fragment = body
                        .get(
                            ..body
                                .len()
                                .checked_sub(pad)
                                .ok_or_else(|| invalid("padding longer than the frame"))?,
                        )
                        .ok_or_else(|| invalid("bad padding"))?;
                    self.pending = Some(Pending {
                        stream,
                        flags,
                        priority,
                        block: fragment.to_vec(),
                    });
                }
                (CONTINUATION, true) => {
                    let p = self
                        .pending
                        .as_mut()
                        .ok_or_else(|| invalid("continuation"))?;
                    if p.stream != stream {
                        return Err(invalid("CONTINUATION of another stream"));
                    }
                    p.block.extend_from_slice(payload);
                    if p.block.len() > MAX_BLOCK {
                        return Err(invalid("header block too large"));
                    }
                }
                (_, true) => return Err(invalid("a frame inside a header block")),
                (_, false) => self
                    .output
                    .extend_from_slice(&self.input[at..at + HEADER_LEN + len]),
            }
            let done = match (kind, flags) {
                (HEADERS | CONTINUATION, f) => f & END_HEADERS != 0,
                _ => false,
            };
            if done && let Some(p) = self.pending.take() {
                let block = rewrite_block(&p.block).map_err(|Malformed(why)| invalid(why))?;
                emit_headers(&mut self.output, &p, &block);
            }
            at += HEADER_LEN + len;
        }
        self.input.drain(..at);
        Ok(())
    }
}

/// Writes a header block as HEADERS (+ CONTINUATION) frames of at most [`MAX_FRAME`] bytes.
fn emit_headers(out: &mut Vec<u8>, p: &Pending, block: &[u8]) {
    let priority = p.priority.as_ref().map_or(&[][..], |x| &x[..]);
    let first = (MAX_FRAME - priority.len()).min(block.len());
    let mut frame = |kind: u8, flags: u8, parts: &[&[u8]]| {
        let len: usize = parts.iter().map(|x| x.len()).sum();
        Header {
            len: len as u32,
            kind,
            flags,
            stream: p.stream,
        }
        .write(out);
        for part in parts {
            out.extend_from_slice(part);
        }
    };
    let rest = &block[first..];
    let end_headers = if rest.is_empty() { END_HEADERS } else { 0 };
    let flags = (p.flags & (END_STREAM | PRIORITY)) | end_headers;
    frame(HEADERS, flags, &[priority, &block[..first]]);
    let mut chunks = rest.chunks(MAX_FRAME).peekable();
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            END_HEADERS
        } else {
            0
        };
        frame(CONTINUATION, flags, &[chunk]);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.taken < this.output.len() {
                let n = buf.remaining().min(this.output.len() - this.taken);
                buf.put_slice(&this.output[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.output.len() {
                    this.output.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => {
                    this.input.extend_from_slice(read.filled());
                    if this.input.len() > MAX_BLOCK + MAX_FRAME + 9 {
                        return Poll::Ready(Err(invalid("a frame larger than the plugin reads")));
                    }
                    this.process()?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The connection's own information (a Unix socket's peer credentials), which the routes check.
impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FixAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header block as grpc-go writes a request's: `:method POST` (static 3), `:scheme http` (static 6),
    /// `:path` literal with indexing (name index 4), `:authority` literal with indexing (name index 1) whose
    /// value is the socket path, `content-type` literal without indexing (name index 31), and an indexed field.
    fn block(authority: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, 0x86, 0x44, 0x05];
        b.extend_from_slice(b"/a/Bc");
        b.push(0x41);
        b.push(authority.len() as u8);
        b.extend_from_slice(authority);
        b.push(0x0f);
        b.push(31 - 15);
        b.push(0x10);
        b.extend_from_slice(b"application/grpc");
        b.push(0xbe); // dynamic index 62
        b
    }

    #[test]
    fn the_authority_becomes_localhost_and_nothing_else_changes() {
        let path = b"/var/lib/kubelet/plugins_registry/csi.pdp-injector.io-reg.sock";
        assert_eq!(rewrite_block(&block(path)).unwrap(), block(b"localhost"));
        // A block without :authority is left as it is.
        let other = [0x83, 0x86, 0x04, 0x02, b'/', b'x'];
        assert_eq!(rewrite_block(&other).unwrap(), other.to_vec());
        // A literal name ":authority", never indexed, with a long path (a multi-byte length).
        let long = vec![b'/'; 300];
        let mut b = vec![0x10, 10];
        b.extend_from_slice(b":authority");
        b.extend_from_slice(&[0x7f, 0xad, 0x01]); // 300 = 127 + 45 + 1 * 128
        b.extend_from_slice(&long);
        let mut want = vec![0x10, 10];
        want.extend_from_slice(b":authority");
        want.push(9);
        want.extend_from_slice(b"localhost");
        assert_eq!(rewrite_block(&b).unwrap(), want);
        // A Huffman-coded value is skipped by its length and replaced as well.
        let huff = [0x41, 0x83, 0xaa, 0xbb, 0xcc, 0x82];
        assert_eq!(
            rewrite_block(&huff).unwrap(),
            [&[0x41, 9][..], b"localhost", &[0x82]].concat()
        );
    }

    #[test]
    fn a_truncated_block_is_refused_not_guessed() {
        assert!(rewrite_block(&[0x41, 0x05, b'a']).is_err());
        assert!(rewrite_block(&[0x7f]).is_err());
        assert!(rewrite_block(&[0x41, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

    fn frame(kind: u8, flags: u8, stream: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            stream,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[tokio::test]
    async fn a_connection_is_rewritten_across_frames_and_reads() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let path = b"/run/csi.sock";
        let b = block(path);
        let (one, two) = b.split_at(7);
        let mut padded = vec![3u8];
        padded.extend_from_slice(one);
        padded.extend_from_slice(&[0, 0, 0]);
        let settings = frame(0x4, 0, 0, &[]);
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame(HEADERS, PADDED, 1, &padded));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, two));
        let data = frame(0x0, END_STREAM, 1, b"hello");
        input.extend(&data);
        let (mut client, server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            // A byte at a time: frames cut anywhere.
            for byte in input {
                client.write_all(&[byte]).await.unwrap();
            }
            client.shutdown().await.unwrap();
        });
        let mut fixed = FixAuthority::new(server);
        let mut got = Vec::new();
        fixed.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        let mut want = PREFACE.to_vec();
        want.extend(settings);
        want.extend(frame(HEADERS, END_HEADERS, 1, &block(b"localhost")));
        want.extend(data);
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_frame_inside_a_header_block_or_no_preface_is_an_error() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x83]));
        input.extend(frame(0x0, 0, 1, b"x"));
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(&input).await.unwrap();
        drop(client);
        let err = FixAuthority::new(server)
            .read_to_end(&mut Vec::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("inside a header block"), "{err}");
        let (mut client, server) = tokio::io::duplex(1024);
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        drop(client);
        let err = FixAuthority::new(server)
            .read_to_end(&mut Vec::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("preface"), "{err}");
    }
}
