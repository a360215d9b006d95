//! The byte-level parts of the reader: 64-byte blocks classified at once, escapes, numbers and literals.

use wide::u8x64;

use super::{Fallback, Result};

/// The bytes of a 64-byte block that stop a string's search (`"`, `\`, control characters), as bits.
#[inline]
pub(super) fn stop_mask(block: &[u8; 64]) -> u64 {
    let classes = classify(block);
    classes.quote | classes.backslash | classes.control
}

/// The 64 bytes from `start` (which is inside the text), the text's tail padded with spaces: whitespace, so
/// neither a stop nor a token.
#[inline]
pub(super) fn block_at(bytes: &[u8], start: usize) -> [u8; 64] {
    match bytes.get(start..).and_then(<[u8]>::first_chunk::<64>) {
        Some(block) => *block,
        None => {
            let mut padded = [b' '; 64];
            let tail = bytes.get(start..).unwrap_or_default();
            padded[..tail.len()].copy_from_slice(tail);
            padded
        }
    }
}

pub(super) fn hex4(bytes: &[u8], at: usize) -> Result<u32> {
    let digits = bytes.get(at..at + 4).ok_or(Fallback)?;
    digits.iter().try_fold(0u32, |n, &d| {
        let v = (d as char).to_digit(16).ok_or(Fallback)?;
        Ok(n * 16 + v)
    })
}

/// The text of a string with escapes (already checked by `skip_string`), unescaped into `out`; a lone
/// surrogate is refused, as serde_json refuses it in a string it reads.
pub(super) fn unescape(s: &str, out: &mut String) -> Result<()> {
    let b = s.as_bytes();
    let mut i = 0;
    while let Some(offset) = memchr::memchr(b'\\', &b[i..]) {
        out.push_str(s.get(i..i + offset).ok_or(Fallback)?);
        i += offset + 1;
        let c = match b.get(i).ok_or(Fallback)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = hex4(b, i + 1)?;
                i += 4;
                if (0xD800..0xDC00).contains(&first) {
                    if b.get(i + 1..i + 3) != Some(b"\\u") {
                        return Err(Fallback);
                    }
                    let second = hex4(b, i + 3)?;
                    if !(0xDC00..0xE000).contains(&second) {
                        return Err(Fallback);
                    }
                    i += 6;
                    char::from_u32(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00))
                        .ok_or(Fallback)?
                } else {
                    char::from_u32(first).ok_or(Fallback)?
                }
            }
            _ => return Err(Fallback),
        };
        out.push(c);
        i += 1;
    }
    out.push_str(s.get(i..).ok_or(Fallback)?);
    Ok(())
}

/// The bytes of a 64-byte block by class, one bit per byte.
pub(super) struct Classes {
    pub(super) quote: u64,
    pub(super) backslash: u64,
    /// `{ } [ ]`, and four bytes JSON allows nowhere outside a string (`Y _ y` and DEL), which the skip then
    /// refuses: one compare instead of four.
    pub(super) bracket: u64,
    /// Bytes below 0x20 (never allowed in a string).
    pub(super) control: u64,
}

/// Each class a vector compare and its bits gathered at once (`wide`: SSE2's `pmovmskb` on x86-64, NEON on
/// aarch64, plain loops elsewhere; no `unsafe` here). Gathering the bits is what portable code cannot say: five
/// classes by plain loops and multiplications cost about 500 instructions per block against 136.
#[inline(always)]
pub(super) fn classify(block: &[u8; 64]) -> Classes {
    let v = u8x64::new(*block);
    Classes {
        quote: v.simd_eq(u8x64::splat(b'"')).to_bitmask(),
        backslash: v.simd_eq(u8x64::splat(b'\\')).to_bitmask(),
        // `[` 0x5B, `]` 0x5D, `{` 0x7B and `}` 0x7D differ only in bits 1, 2 and 5.
        bracket: (v & u8x64::splat(0xD9))
            .simd_eq(u8x64::splat(0x59))
            .to_bitmask(),
        control: v.min(u8x64::splat(0x1F)).simd_eq(v).to_bitmask(),
    }
}

/// Bit `i` set when an odd number of bits at or below `i` are: the bytes from an opening quote up to, not
/// including, its closing one.
#[inline]
pub(super) fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// The bytes escaped by a backslash, given the block's backslashes and whether its first byte is escaped by
/// the last of the block before (`carry`, updated for the next block). Backslashes are rare (a few per Pod), so
/// they are followed one by one: a backslash that is itself escaped escapes nothing.
#[inline]
pub(super) fn escaped_bytes(backslash: u64, carry: &mut u64) -> u64 {
    let mut escaped = *carry;
    *carry = 0;
    let mut rest = backslash;
    while rest != 0 {
        let i = rest.trailing_zeros();
        rest &= rest - 1;
        if escaped & (1 << i) != 0 {
            continue;
        }
        if i == 63 {
            *carry = 1;
        } else {
            escaped |= 1 << (i + 1);
        }
    }
    escaped
}

/// Where a number that starts at `at` ends, by JSON's grammar (no leading zero, digits after a point and in an
/// exponent).
pub(super) fn number_end(b: &[u8], at: usize) -> Result<usize> {
    let digits = |mut i: usize| {
        while matches!(b.get(i), Some(b'0'..=b'9')) {
            i += 1;
        }
        i
    };
    let mut i = at;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => {
            i += 1;
            if matches!(b.get(i), Some(b'0'..=b'9')) {
                return Err(Fallback);
            }
        }
        Some(b'1'..=b'9') => i = digits(i + 1),
        _ => return Err(Fallback),
    }
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err(Fallback);
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err(Fallback);
        }
        i = end;
    }
    Ok(i)
}

/// The length of the escape whose letter is at `at` (just after its backslash): one of JSON's, `\u` with four
/// hexadecimal digits. Only the digits are checked here, as serde_json does in what it skips; a string that is
/// read is unescaped, and a lone surrogate refused, by `unescape`.
pub(super) fn escape_len(bytes: &[u8], at: usize) -> Result<usize> {
    match bytes.get(at) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(1),
        Some(b'u') => hex4(bytes, at + 1).map(|_| 5),
        _ => Err(Fallback),
    }
}

/// The escaped bytes of a block (bit `j`: byte `base + j`) are each the letter of one of JSON's escapes.
pub(super) fn check_escapes(bytes: &[u8], base: usize, escaped: u64) -> Result<()> {
    let mut rest = escaped;
    while rest != 0 {
        escape_len(bytes, base + rest.trailing_zeros() as usize)?;
        rest &= rest - 1;
    }
    Ok(())
}

/// Where a number or literal that starts at `at` ends, by JSON's grammar.
pub(super) fn scalar_end(bytes: &[u8], at: usize) -> Result<usize> {
    let word: &[u8] = match bytes.get(at) {
        Some(b't') => b"true",
        Some(b'f') => b"false",
        Some(b'n') => b"null",
        _ => return number_end(bytes, at),
    };
    if bytes.get(at..).is_some_and(|rest| rest.starts_with(word)) {
        Ok(at + word.len())
    } else {
        Err(Fallback)
    }
}

/// Closes the innermost open container (`open`'s lowest bit); whether it was the outermost.
#[inline(always)]
pub(super) fn close(open: &mut u128, depth: &mut u32) -> bool {
    *open >>= 1;
    *depth -= 1;
    *depth == 0
}
