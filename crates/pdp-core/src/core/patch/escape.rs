//! Strings written as serde_json writes them inside a JSON string: lengths, escapes, and a formatter that escapes.

/// The length of `s` written as a JSON string, quotes included.
pub(super) fn json_string_len(s: &str) -> usize {
    if !needs_escape(s.as_bytes()) {
        return s.len() + 2;
    }
    let escaped: usize = s
        .bytes()
        .map(|b| match escape(b) {
            None => 1,
            Some(e) => e.len(),
        })
        .sum();
    escaped + 2
}

/// How serde_json writes byte `b` inside a JSON string, when not as itself: quote, backslash and the control
/// characters (short forms where JSON has one). Every other byte, UTF-8 included, is written as it is.
fn escape(b: u8) -> Option<&'static [u8]> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // `\u00XX` for every control character, built once.
    const CONTROL: [[u8; 6]; 32] = {
        let mut t = [[0u8; 6]; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = [b'\\', b'u', b'0', b'0', HEX[i >> 4], HEX[i & 15]];
            i += 1;
        }
        t
    };
    match b {
        b'"' => Some(br#"\""#),
        b'\\' => Some(br"\\"),
        b'\n' => Some(br"\n"),
        b'\r' => Some(br"\r"),
        b'\t' => Some(br"\t"),
        0x08 => Some(br"\b"),
        0x0c => Some(br"\f"),
        b if b < 0x20 => Some(&CONTROL[b as usize]),
        _ => None,
    }
}

/// Whether any byte of `bytes` is escaped in a JSON string. Most texts (every pointer rendering writes) have
/// none: a count without branches, which the compiler vectorises, says so faster than a test of each byte.
fn needs_escape(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .filter(|&&b| b < 0x20 || b == b'"' || b == b'\\')
        .count()
        > 0
}

/// Appends `bytes` as the content of a JSON string (no quotes), escaped as serde_json escapes.
pub(super) fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if let Some(e) = escape(b) {
            out.extend_from_slice(&bytes[start..i]);
            out.extend_from_slice(e);
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// serde_json's compact JSON, written as the content of a JSON string: what [`escape_into`] makes of
/// serde_json's output, in one pass. serde_json hands strings over in fragments without quotes, backslashes or
/// control characters, so only the strings' quotes and their escapes' backslashes change.
pub(super) struct Escaped;

impl serde_json::ser::Formatter for Escaped {
    fn begin_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(br#"\""#)
    }

    fn end_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(br#"\""#)
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        // The escape as serde_json writes it (at most six bytes: `\u001f`), then escaped itself.
        let mut json = [0u8; 6];
        let mut rest = &mut json[..];
        serde_json::ser::CompactFormatter.write_char_escape(&mut rest, escape)?;
        let len = 6 - rest.len();
        let mut out = Vec::with_capacity(12);
        escape_into(&mut out, &json[..len]);
        w.write_all(&out)
    }

    fn write_raw_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(fragment.len() + 16);
        escape_into(&mut out, fragment.as_bytes());
        w.write_all(&out)
    }
}
