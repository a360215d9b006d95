//! The reader of the webhook's JSON: a serde `Deserializer` over text, faster than serde_json's where the
//! webhook spends its time (skipping the fields it does not read, and borrowing the strings and raw slices it
//! does), with serde_json as the authority.
//!
//! [`from_str`] reads with this reader first; on any failure it parses the text again with serde_json and
//! returns serde_json's answer, so an error's message (and the `where_wrong` path of a Pod's bad field) is
//! always serde_json's own. The fast path therefore never has to explain anything: whatever it does not handle
//! (floats, negative numbers, enums, a struct written as a list, nesting past 128 levels) it refuses and leaves
//! to serde_json. It never reads a value other than serde_json's, and `tests` compare the two readers on valid
//! and broken texts. The input is `&str`: UTF-8 was checked once for the whole body.
//!
//! What it checks: JSON's whole grammar in the values a type reads (strings with their escapes and control
//! characters, numbers, literals, commas and colons, one value and only whitespace after it). In an object or
//! list it skips (`IgnoredAny`, and the text of a `RawValue`) it checks JSON's *structure* only, the part that
//! decides where the value ends: strings closed, with JSON's escapes and no control character, no backslash
//! outside a string, and brackets that match ([`has_structure`] is the byte-by-byte definition). A comma,
//! colon, number or literal out of place there is not refused, as simdjson's On-Demand front end does not
//! refuse it in the values it skips (serde_json itself does not check UTF-8 in a string it skips). No answer
//! depends on that grammar: the apiserver only sends what its own encoder wrote, a skipped value is never
//! copied into a patch, and a raw value the core does read (an `env` list that may define one of our
//! variables, a volume of the name we add) is parsed again, its fields read checked by the whole grammar. So a
//! text serde_json
//! refuses is either refused here too or has its only faults inside such a value, and a value's end is always
//! serde_json's: the fields read after it are the same.
//!
//! Why it is faster: serde_json skips an unread value token by token through its general machinery (about
//! 12 instructions per byte of a Pod's env lists, callgrind). Here a skipped object or list is read by 64-byte
//! blocks, as simdjson's first stage reads them: the quotes, backslashes, brackets and control characters of a
//! block are found at once (vector compares whose bits are gathered into one word, through `wide`), the
//! strings' extent follows from the quotes (a prefix XOR), and only the brackets outside strings are visited
//! (`Reader::skip_container`), about one in five of the tokens a grammar check visits. The strings a type
//! reads end at the first stop of the same kind of block, kept while the strings in it are read.

use std::fmt;

use serde::Deserialize;
use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use wide::u8x64;

/// serde_json's name for `RawValue` in the serde protocol: `&RawValue`'s `Deserialize` asks for a newtype struct
/// of this name and takes the text from a one-entry map. Private to serde_json; were it to change, a `RawValue`
/// would fail here and fall back to serde_json, slower but still right (unit test `raw_values_are_read_here`).
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Nesting of the values a type reads, as serde_json's recursion limit (skipped values have their own, below).
const TYPED_DEPTH: u8 = 128;

/// Nesting inside a skipped value that the fast path follows (one bit per level); deeper is left to serde_json,
/// which walks it without a limit.
const SKIPPED_DEPTH: u32 = 128;

/// The fast path declined: serde_json reads the text again and decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback;

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("left to serde_json")
    }
}

impl std::error::Error for Fallback {}

impl de::Error for Fallback {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Fallback
    }
}

type Result<T> = std::result::Result<T, Fallback>;

/// Reads `text` as `T`: what `serde_json::from_str` returns, value or error, sooner; but a text whose only
/// faults are of JSON's grammar inside a skipped object or list is read (the module's doc says why).
pub fn from_str<'a, T: Deserialize<'a>>(text: &'a str) -> serde_json::Result<T> {
    match read(text) {
        Ok(value) => Ok(value),
        Err(Fallback) => serde_json::from_str(text),
    }
}

/// The fast path alone (for the tests and the fuzz checks that compare it with serde_json).
pub fn read<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T> {
    let mut reader = Reader::new(text);
    let value = T::deserialize(&mut reader)?;
    reader.end().map(|()| value)
}

/// A list in `text` handed to `visitor` by the fast path, for a visitor that may stop before the list's end
/// (which, as in serde_json, ends in an error): the caller reads what the visitor saw.
pub fn visit_seq<'a, V: Visitor<'a>>(text: &'a str, visitor: V) -> Result<V::Value> {
    let mut reader = Reader::new(text);
    let value = (&mut reader).deserialize_seq(visitor)?;
    reader.end().map(|()| value)
}

/// Whether `text` has JSON's structure, by the byte-by-byte definition: strings closed, with JSON's escapes and
/// no control character, no backslash outside a string, brackets that match. What the fast path checks of the
/// objects and lists it skips, for the tests and the fuzz checks: a text it reads has this structure, also when
/// serde_json refuses the text.
pub fn has_structure(text: &str) -> bool {
    let b = text.as_bytes();
    let mut open = Vec::new();
    let mut i = 0;
    while let Some(&byte) = b.get(i) {
        match byte {
            b'"' => loop {
                i += 1;
                match b.get(i) {
                    Some(b'"') => break,
                    Some(b'\\') => match escape_len(b, i + 1) {
                        Ok(len) => i += len,
                        Err(Fallback) => return false,
                    },
                    Some(&c) if c >= 0x20 => {}
                    _ => return false,
                }
            },
            b'{' | b'[' => open.push(byte),
            b'}' if open.pop() == Some(b'{') => {}
            b']' if open.pop() == Some(b'[') => {}
            b'}' | b']' | b'\\' => return false,
            _ => {}
        }
        i += 1;
    }
    open.is_empty()
}

struct Reader<'de> {
    text: &'de str,
    bytes: &'de [u8],
    pos: usize,
    /// Typed nesting still allowed.
    depth: u8,
    /// An escaped string, unescaped (most strings have no escape and are lent from the text).
    scratch: String,
    /// Where the 64-byte block of `stops` starts (`usize::MAX`: none yet).
    block: usize,
    /// Bit `k` set when byte `block + k` is a quote, a backslash or a control character.
    stops: u64,
}

/// The bytes of a 64-byte block that stop a string's search (`"`, `\`, control characters), as bits.
#[inline]
fn stop_mask(block: &[u8; 64]) -> u64 {
    let classes = classify(block);
    classes.quote | classes.backslash | classes.control
}

/// The 64 bytes from `start` (which is inside the text), the text's tail padded with spaces: whitespace, so
/// neither a stop nor a token.
#[inline]
fn block_at(bytes: &[u8], start: usize) -> [u8; 64] {
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

fn hex4(bytes: &[u8], at: usize) -> Result<u32> {
    let digits = bytes.get(at..at + 4).ok_or(Fallback)?;
    digits.iter().try_fold(0u32, |n, &d| {
        let v = (d as char).to_digit(16).ok_or(Fallback)?;
        Ok(n * 16 + v)
    })
}

/// The text of a string with escapes (already checked by `skip_string`), unescaped into `out`; a lone
/// surrogate is refused, as serde_json refuses it in a string it reads.
fn unescape(s: &str, out: &mut String) -> Result<()> {
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
struct Classes {
    quote: u64,
    backslash: u64,
    /// `{ } [ ]`, and four bytes JSON allows nowhere outside a string (`Y _ y` and DEL), which the skip then
    /// refuses: one compare instead of four.
    bracket: u64,
    /// Bytes below 0x20 (never allowed in a string).
    control: u64,
}

/// Each class a vector compare and its bits gathered at once (`wide`: SSE2's `pmovmskb` on x86-64, NEON on
/// aarch64, plain loops elsewhere; no `unsafe` here). Gathering the bits is what portable code cannot say: five
/// classes by plain loops and multiplications cost about 500 instructions per block against 136.
#[inline(always)]
fn classify(block: &[u8; 64]) -> Classes {
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
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// The bytes escaped by a backslash, given the block's backslashes and whether its first byte is escaped by
/// the last of the block before (`carry`, updated for the next block). Backslashes are rare (a few per Pod), so
/// they are followed one by one: a backslash that is itself escaped escapes nothing.
#[inline]
fn escaped_bytes(backslash: u64, carry: &mut u64) -> u64 {
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
fn number_end(b: &[u8], at: usize) -> Result<usize> {
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
fn escape_len(bytes: &[u8], at: usize) -> Result<usize> {
    match bytes.get(at) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(1),
        Some(b'u') => hex4(bytes, at + 1).map(|_| 5),
        _ => Err(Fallback),
    }
}

/// The escaped bytes of a block (bit `j`: byte `base + j`) are each the letter of one of JSON's escapes.
fn check_escapes(bytes: &[u8], base: usize, escaped: u64) -> Result<()> {
    let mut rest = escaped;
    while rest != 0 {
        escape_len(bytes, base + rest.trailing_zeros() as usize)?;
        rest &= rest - 1;
    }
    Ok(())
}

/// Where a number or literal that starts at `at` ends, by JSON's grammar.
fn scalar_end(bytes: &[u8], at: usize) -> Result<usize> {
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
fn close(open: &mut u128, depth: &mut u32) -> bool {
    *open >>= 1;
    *depth -= 1;
    *depth == 0
}

impl<'de> Reader<'de> {
    fn new(text: &'de str) -> Self {
        Reader {
            text,
            bytes: text.as_bytes(),
            pos: 0,
            depth: TYPED_DEPTH,
            scratch: String::new(),
            block: usize::MAX,
            stops: 0,
        }
    }

    /// The index of the first `"`, `\` or control character at or after `i`, or the length: by whole 64-byte
    /// blocks, each searched once and kept while the strings in it are read (a Pod's strings are short: most
    /// searches end in the block the last one ended in).
    #[inline]
    fn next_stop(&mut self, mut i: usize) -> usize {
        loop {
            let start = i & !63;
            if start >= self.bytes.len() {
                return self.bytes.len();
            }
            if self.block != start {
                self.stops = stop_mask(&block_at(self.bytes, start));
                self.block = start;
            }
            let ahead = self.stops & (u64::MAX << (i - start));
            if ahead != 0 {
                return start + ahead.trailing_zeros() as usize;
            }
            i = start + 64;
        }
    }

    /// Only whitespace may follow the value.
    fn end(&mut self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Fallback),
        }
    }

    /// The next byte after whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        loop {
            match self.bytes.get(self.pos) {
                Some(b' ' | b'\n' | b'\r' | b'\t') => self.pos += 1,
                Some(&b) => return Some(b),
                None => return None,
            }
        }
    }

    #[inline]
    fn eat(&mut self, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Fallback)
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(Fallback)
        }
    }

    /// From just after an opening quote to just after the closing one, checking escapes and refusing control
    /// characters; whether the string holds an escape.
    #[inline]
    fn skip_string(&mut self) -> Result<bool> {
        // Most strings end in the block the previous one ended in, with nothing to check on the way: that case
        // is a few instructions inline, the rest a call.
        let start = self.pos & !63;
        if self.block == start {
            let ahead = self.stops & (u64::MAX << (self.pos - start));
            let at = start + ahead.trailing_zeros() as usize;
            if ahead != 0 && self.bytes.get(at) == Some(&b'"') {
                self.pos = at + 1;
                return Ok(false);
            }
        }
        self.skip_string_on()
    }

    #[inline(never)]
    fn skip_string_on(&mut self) -> Result<bool> {
        let mut escaped = false;
        loop {
            let i = self.next_stop(self.pos);
            match self.bytes.get(i) {
                Some(b'"') => {
                    self.pos = i + 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.pos = i + 1 + escape_len(self.bytes, i + 1)?;
                }
                _ => return Err(Fallback),
            }
        }
    }

    /// A number by JSON's grammar.
    fn skip_number(&mut self) -> Result<()> {
        self.pos = number_end(self.bytes, self.pos)?;
        Ok(())
    }

    /// Skips one value, checking its grammar.
    fn skip_value(&mut self) -> Result<()> {
        match self.peek() {
            Some(b'{' | b'[') => self.skip_container(),
            Some(b'"') => {
                self.pos += 1;
                self.skip_string().map(drop)
            }
            Some(b't' | b'f' | b'n' | b'-' | b'0'..=b'9') => {
                self.pos = scalar_end(self.bytes, self.pos)?;
                Ok(())
            }
            _ => Err(Fallback),
        }
    }

    /// Skips the object or list at `pos` (its `{` or `[`) by 64-byte blocks, as simdjson's first stage finds
    /// a block's structure: its quotes, backslashes and brackets are found at once, the strings' extent follows
    /// from the quotes no backslash escapes (a prefix XOR), and only the brackets outside strings are visited,
    /// each closing the kind it opened; the open containers are the bits of one integer (1 for an object), the
    /// innermost lowest. The masks check the rest of the structure: no control character in a string, every
    /// escape one of JSON's, no backslash outside a string. The grammar between the brackets is not checked
    /// (the module's doc says why).
    fn skip_container(&mut self) -> Result<()> {
        let bytes = self.bytes;
        let mut base = self.pos;
        // All ones when the block before ended inside a string; bit 0 when it ended in an escaping backslash.
        let mut in_string = 0u64;
        let mut escape_carry = 0u64;
        let mut open: u128 = 0;
        let mut depth: u32 = 0;
        while base < bytes.len() {
            let block = block_at(bytes, base);
            let classes = classify(&block);
            let mut escaped = 0;
            if classes.backslash | escape_carry != 0 {
                escaped = escaped_bytes(classes.backslash, &mut escape_carry);
                check_escapes(bytes, base, escaped)?;
            }
            let quotes = classes.quote & !escaped;
            let string = prefix_xor(quotes) ^ in_string;
            in_string = ((string as i64) >> 63) as u64;
            if (classes.control & string) | (classes.backslash & !string) != 0 {
                return Err(Fallback);
            }
            let mut brackets = classes.bracket & !string;
            while brackets != 0 {
                let i = brackets.trailing_zeros() as usize;
                brackets &= brackets - 1;
                let object = open & 1 == 1;
                match block[i] {
                    b'{' if depth < SKIPPED_DEPTH => {
                        open = (open << 1) | 1;
                        depth += 1;
                    }
                    b'[' if depth < SKIPPED_DEPTH => {
                        open <<= 1;
                        depth += 1;
                    }
                    // The first byte is the container's own bracket, so `depth` is never 0 here.
                    b'}' if object => {
                        if close(&mut open, &mut depth) {
                            self.pos = base + i + 1;
                            return Ok(());
                        }
                    }
                    b']' if !object => {
                        if close(&mut open, &mut depth) {
                            self.pos = base + i + 1;
                            return Ok(());
                        }
                    }
                    _ => return Err(Fallback),
                }
            }
            base += 64;
        }
        Err(Fallback)
    }

    /// A string at `pos` (its opening quote), lent from the text when it has no escape.
    fn read_str<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.pos += 1;
        let start = self.pos;
        let escaped = self.skip_string()?;
        let text = self.text.get(start..self.pos - 1).ok_or(Fallback)?;
        if !escaped {
            return visitor.visit_borrowed_str(text);
        }
        self.scratch.clear();
        unescape(text, &mut self.scratch)?;
        visitor.visit_str(&self.scratch)
    }

    fn enter(&mut self) -> Result<()> {
        self.depth = self.depth.checked_sub(1).ok_or(Fallback)?;
        Ok(())
    }

    fn read_seq<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.pos += 1;
        self.enter()?;
        let value = visitor.visit_seq(Seq {
            reader: self,
            first: true,
        })?;
        self.depth += 1;
        // A visitor that stopped early leaves elements behind: an error, as in serde_json.
        self.eat(b']')?;
        Ok(value)
    }

    fn read_map<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.pos += 1;
        self.enter()?;
        let value = visitor.visit_map(Map {
            reader: self,
            first: true,
        })?;
        self.depth += 1;
        self.eat(b'}')?;
        Ok(value)
    }
}

struct Seq<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Seq<'_, 'de> {
    type Error = Fallback;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        match self.reader.peek() {
            Some(b']') => return Ok(None),
            Some(b',') if !self.first => self.reader.pos += 1,
            Some(_) if self.first => {}
            _ => return Err(Fallback),
        }
        self.first = false;
        // After a comma, a `]` is no value: every method below refuses it.
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

struct Map<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> MapAccess<'de> for Map<'_, 'de> {
    type Error = Fallback;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        match self.reader.peek() {
            Some(b'}') => return Ok(None),
            Some(b',') if !self.first => {
                self.reader.pos += 1;
                if self.reader.peek() != Some(b'"') {
                    return Err(Fallback);
                }
            }
            Some(b'"') if self.first => {}
            _ => return Err(Fallback),
        }
        self.first = false;
        seed.deserialize(&mut *self.reader).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        self.reader.eat(b':')?;
        seed.deserialize(&mut *self.reader)
    }
}

/// A raw value as serde_json hands it to `&RawValue`: one entry, the token and the text.
struct RawMap<'de>(Option<&'de str>);

impl<'de> MapAccess<'de> for RawMap<'de> {
    type Error = Fallback;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.0.is_none() {
            return Ok(None);
        }
        seed.deserialize(BorrowedStrDeserializer::new(RAW_VALUE_TOKEN))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let raw = self.0.take().ok_or(Fallback)?;
        seed.deserialize(BorrowedStrDeserializer::new(raw))
    }
}

impl<'de> Deserializer<'de> for &mut Reader<'de> {
    type Error = Fallback;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'n') => self.deserialize_unit(visitor),
            Some(b't' | b'f') => self.deserialize_bool(visitor),
            Some(b'"') => self.read_str(visitor),
            Some(b'[') => self.read_seq(visitor),
            Some(b'{') => self.read_map(visitor),
            // Non-negative integers only: serde_json's choice between i64, u64 and f64 for the others (`-0` is
            // a float there) is left to it.
            Some(b'0'..=b'9') => {
                let start = self.pos;
                self.skip_number()?;
                let digits = &self.text[start..self.pos];
                if !digits.bytes().all(|d| d.is_ascii_digit()) {
                    return Err(Fallback);
                }
                visitor.visit_u64(digits.parse().map_err(|_| Fallback)?)
            }
            _ => Err(Fallback),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b't') => {
                self.literal(b"true")?;
                visitor.visit_bool(true)
            }
            Some(b'f') => {
                self.literal(b"false")?;
                visitor.visit_bool(false)
            }
            _ => Err(Fallback),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'"') => self.read_str(visitor),
            _ => Err(Fallback),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'n') => {
                self.literal(b"null")?;
                visitor.visit_none()
            }
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'n') => {
                self.literal(b"null")?;
                visitor.visit_unit()
            }
            _ => Err(Fallback),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        if name == RAW_VALUE_TOKEN {
            // As serde_json: the value's own text, without the whitespace around it.
            self.peek();
            let start = self.pos;
            self.skip_value()?;
            let raw = self.text.get(start..self.pos).ok_or(Fallback)?;
            return visitor.visit_map(RawMap(Some(raw)));
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'[') => self.read_seq(visitor),
            _ => Err(Fallback),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b'{') => self.read_map(visitor),
            _ => Err(Fallback),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        // serde_json also reads a struct from a list of its fields in order: left to it.
        self.deserialize_map(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip_value()?;
        visitor.visit_unit()
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value> {
        Err(Fallback)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Fallback)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Fallback)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char tuple tuple_struct
    }
}

#[cfg(test)]
mod tests;
