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

mod blocks;
mod reader;

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use blocks::escape_len;
use reader::Reader;

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

#[cfg(test)]
mod tests;
