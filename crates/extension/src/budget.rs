//! A bound on how much a request body may cost once parsed, checked before it is parsed.
//!
//! The hook objects stay untyped JSON (`serde_json::Value`): an InfraMachine is any
//! provider's kind, and any change to it must be seen. A `Value` costs about 80 bytes per
//! JSON value (with `preserve_order`), so a 16 MiB body of `[{},{},...]` became 444 MB. The
//! body is therefore first walked by a counting visitor that allocates nothing and stops at
//! the first value over [`MAX_JSON_VALUES`]. With the typed request and the copies a hook
//! keeps while the agent answers, a request costs about 225 bytes per value (22 MB at the
//! limit, measured); the HTTP layer reserves that from `server.max_parsed_mib` before it
//! parses (`http::Budget`).

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Largest request body accepted, bytes (a KubeadmConfig holds at most 200 files of 10 KiB,
/// and a request carries up to six objects).
pub(crate) const MAX_BODY: usize = 16 << 20;

/// What a parsed request costs per JSON value, bytes: the typed request and the untyped
/// objects it holds while the agent answers (measured: about 225 bytes per value for
/// 98 000 values of `{}` and `0`, so 22 MB for one request of the largest count).
pub(crate) const PARSED_BYTES_PER_VALUE: usize = 256;

/// Copies of the decoded file contents a hook holds at once: the translation's delta or
/// the NodeSpec, the copy in the request to the agent, and its encoding.
pub(crate) const DECODED_COPIES: u64 = 3;

/// The most one request reserves for its parsed form, MiB: the value limit at
/// [`PARSED_BYTES_PER_VALUE`], the strings of the largest body, and [`DECODED_COPIES`]
/// of the most one bootstrap config's files decode to
/// ([`crate::capi::translate::MAX_DECODED_CONFIG_BYTES`]); `server.max_parsed_mib` may
/// not be lower.
pub(crate) const MAX_PARSED_MIB: usize = (MAX_JSON_VALUES * PARSED_BYTES_PER_VALUE
    + MAX_BODY
    + DECODED_COPIES as usize * crate::capi::translate::MAX_DECODED_CONFIG_BYTES as usize)
    .div_ceil(1 << 20);

/// Most JSON values (objects, arrays, strings, numbers, booleans, nulls, keys not counted)
/// in one request. The largest legitimate request, a KubeadmConfig of 200 files with a
/// Machine and an InfraMachine, current and desired, holds a few thousand.
pub(crate) const MAX_JSON_VALUES: usize = 100_000;

/// What a string value was, for the map that holds it (`encoding`, `content`).
#[derive(Debug, Clone, Copy)]
struct Str {
    len: usize,
    gzip: bool,
}

struct Count<'a> {
    n: &'a mut usize,
    max: usize,
    decoded: &'a mut u64,
    /// Set to the string this value is, if it is one.
    seen: Option<&'a mut Option<Str>>,
}

impl Count<'_> {
    fn one<E: serde::de::Error>(&mut self) -> Result<(), E> {
        *self.n += 1;
        if *self.n > self.max {
            return Err(E::custom("over the limit"));
        }
        Ok(())
    }

    fn child<'b>(&'b mut self, seen: Option<&'b mut Option<Str>>) -> Count<'b> {
        Count {
            n: self.n,
            max: self.max,
            decoded: self.decoded,
            seen,
        }
    }

    fn string<E: serde::de::Error>(mut self, v: &str) -> Result<(), E> {
        if let Some(s) = self.seen.take() {
            *s = Some(Str {
                len: v.len(),
                gzip: v.starts_with("gz"),
            });
        }
        self.one()
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! leaf {
    ($($f:ident: $t:ty),*) => {$(
        fn $f<E: serde::de::Error>(mut self, _: $t) -> Result<(), E> {
            self.one()
        }
    )*};
}

/// The keys of a cloud-init `files` entry the decoded-size bound reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Encoding,
    Content,
    Other,
}

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Key;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(match v {
            "encoding" => Key::Encoding,
            "content" => Key::Content,
            _ => Key::Other,
        })
    }
}

/// Most bytes a `content` string of `len` bytes decodes to: itself, or for a gzip
/// encoding [`GZIP_MAX_RATIO`] times (DEFLATE's bound: 258 bytes from a 2-bit code) and
/// at most the per-file limit the extension inflates to.
fn decoded_bound(len: usize, gzip: bool) -> u64 {
    if !gzip {
        return len as u64;
    }
    (len as u64)
        .saturating_mul(GZIP_MAX_RATIO)
        .saturating_add(1024)
        .min(crate::capi::translate::MAX_DECODED_FILE_BYTES)
}

/// DEFLATE's largest expansion (RFC 1951: a 258-byte match in as little as 2 bits, about
/// 1032:1).
pub(crate) const GZIP_MAX_RATIO: u64 = 1032;

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64);
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.string(v)
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<(), E> {
        self.string(v)
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.one()
    }
    fn visit_none<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.one()
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(self.child(None))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        let (mut encoding, mut content) = (None, None);
        while let Some(k) = map.next_key_seed(Key::Other)? {
            let seen = match k {
                Key::Encoding => Some(&mut encoding),
                Key::Content => Some(&mut content),
                Key::Other => None,
            };
            map.next_value_seed(self.child(seen))?;
        }
        if let Some(c) = content {
            let gzip = encoding.is_some_and(|e: Str| e.gzip);
            *self.decoded = self.decoded.saturating_add(decoded_bound(c.len, gzip));
        }
        Ok(())
    }
}

/// What [`check`] found in a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    /// JSON values.
    pub values: usize,
    /// At most how many bytes the `content` of its objects decode to (cloud-init
    /// `files` entries: a gzip encoding at [`GZIP_MAX_RATIO`], at most the per-file
    /// limit), counted before anything is decoded.
    pub decoded: u64,
}

/// Counts the JSON values of `body`, stopping at the first over `max`, and bounds what
/// its file contents decode to. Malformed JSON is not an error here: the typed parse
/// that follows reports it with its JSON path.
pub(crate) fn check(body: &[u8], max: usize) -> Result<Counted, String> {
    let (mut n, mut decoded) = (0, 0);
    let _malformed = (Count {
        n: &mut n,
        max,
        decoded: &mut decoded,
        seen: None,
    })
    .deserialize(&mut serde_json::Deserializer::from_slice(body));
    if n > max {
        return Err(format!(
            "more than {max} JSON values (the extension's limit per request)"
        ));
    }
    Ok(Counted { values: n, decoded })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_and_stops_at_the_limit() {
        assert_eq!(
            check(br#"{"a": [1, "x", null, {}], "b": true}"#, 100).map(|c| c.values),
            Ok(7)
        );
        let flood: Vec<u8> = std::iter::once(b'[')
            .chain(std::iter::repeat_n(*b"{},", 1000).flatten())
            .chain(*b"{}]")
            .collect();
        let e = check(&flood, 100).unwrap_err();
        assert_eq!(
            e,
            "more than 100 JSON values (the extension's limit per request)"
        );
        assert_eq!(check(b"{not json", 100).map(|c| c.values), Ok(1));
    }

    #[test]
    fn bounds_what_file_contents_decode_to() {
        let body = br#"{"files": [
            {"path": "/a", "content": "12345678"},
            {"content": "abcd", "encoding": "gzip+base64"},
            {"encoding": "gz", "content": "xyz"},
            {"content": "AAAA", "encoding": "base64"}],
            "big": {"encoding": "gzip", "content": "BIG"}}"#;
        let c = check(body, 100).unwrap();
        let gz = |n: u64| n * GZIP_MAX_RATIO + 1024;
        assert_eq!(c.decoded, 8 + gz(4) + gz(3) + 4 + gz(3));
        // a gzip content never counts more than one file may inflate to
        let long = format!(
            r#"{{"encoding": "gzip", "content": "{}"}}"#,
            "A".repeat(20_000)
        );
        assert_eq!(
            check(long.as_bytes(), 100).unwrap().decoded,
            crate::capi::translate::MAX_DECODED_FILE_BYTES
        );
    }
}
