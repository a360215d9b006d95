//! The reader itself: its position in the text, skipping and reading values, and serde's `Deserializer` over it.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::blocks::{
    block_at, check_escapes, classify, close, escape_len, escaped_bytes, number_end, prefix_xor,
    scalar_end, stop_mask, unescape,
};
use super::{Fallback, RAW_VALUE_TOKEN, Result, SKIPPED_DEPTH, TYPED_DEPTH};

pub(super) struct Reader<'de> {
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

impl<'de> Reader<'de> {
    pub(super) fn new(text: &'de str) -> Self {
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
    pub(super) fn end(&mut self) -> Result<()> {
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
