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

/// Most JSON values (objects, arrays, strings, numbers, booleans, nulls, keys not counted)
/// in one request. The largest legitimate request, a KubeadmConfig of 200 files with a
/// Machine and an InfraMachine, current and desired, holds a few thousand.
pub const MAX_JSON_VALUES: usize = 100_000;

struct Count<'a> {
    n: &'a mut usize,
    max: usize,
}

impl Count<'_> {
    fn one<E: serde::de::Error>(&mut self) -> Result<(), E> {
        *self.n += 1;
        if *self.n > self.max {
            return Err(E::custom("over the limit"));
        }
        Ok(())
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

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str, visit_borrowed_str: &'de str);
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.one()
    }
    fn visit_none<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.one()
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq
            .next_element_seed(Count {
                n: self.n,
                max: self.max,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            map.next_value_seed(Count {
                n: self.n,
                max: self.max,
            })?;
        }
        Ok(())
    }
}

/// Counts the JSON values of `body`, stopping at the first over `max`. Malformed JSON is
/// not an error here: the typed parse that follows reports it with its JSON path.
pub fn check(body: &[u8], max: usize) -> Result<usize, String> {
    let mut n = 0;
    let _malformed =
        (Count { n: &mut n, max }).deserialize(&mut serde_json::Deserializer::from_slice(body));
    if n > max {
        return Err(format!(
            "more than {max} JSON values (the extension's limit per request)"
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_and_stops_at_the_limit() {
        assert_eq!(
            check(br#"{"a": [1, "x", null, {}], "b": true}"#, 100),
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
        assert_eq!(check(b"{not json", 100), Ok(1));
    }
}
