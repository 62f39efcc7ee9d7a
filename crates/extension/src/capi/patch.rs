//! RFC 6902 JSON Patch generation for CAPI coverage.
//!
//! CAPI applies the patch to the whole *current* object, then compares `spec` (or
//! `spec.template.spec`) with desired exactly, with lists atomic. So coverage is expressed
//! per *unit*: a JSON location that is either copied from desired as a whole (a list, a
//! struct such as `ntp`) or one key of a Go map (a [`Unit::key`]).
//! A unit that is not listed is left as it is in current: that difference is what makes
//! CAPI replace (or, with `preserveOnInsufficientCoverage`, keep) the Machine.

use serde_json::{Map, Value, json};

/// One covered location, as RFC 6901 reference tokens from the object root
/// (`["spec", "files"]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Reference tokens (unescaped).
    pub tokens: Vec<String>,
    /// Emit a `test` of the current value before `replace`/`remove`, so a patch computed
    /// against another version of the object fails loudly instead of clobbering it (used
    /// for map keys).
    pub test_before: bool,
}

impl Unit {
    /// A unit copied as a whole, at `tokens`.
    pub fn whole<S: AsRef<str>>(tokens: &[S]) -> Unit {
        Unit {
            tokens: tokens.iter().map(|t| t.as_ref().to_string()).collect(),
            test_before: false,
        }
    }

    /// A map key unit: the same, with `test` before `replace`/`remove`.
    pub fn key<S: AsRef<str>>(tokens: &[S]) -> Unit {
        Unit {
            test_before: true,
            ..Unit::whole(tokens)
        }
    }

    /// The unit's JSON Pointer.
    pub fn pointer(&self) -> String {
        pointer(&self.tokens)
    }
}

/// Renders reference tokens as a JSON Pointer: `~` → `~0`, `/` → `~1` (RFC 6901 §3).
pub fn pointer<S: AsRef<str>>(tokens: &[S]) -> String {
    let mut out = String::new();
    for t in tokens {
        out.push('/');
        out.push_str(&t.as_ref().replace('~', "~0").replace('/', "~1"));
    }
    out
}

/// The value at `tokens` (object members by name, array elements by decimal index).
pub fn get<'a, S: AsRef<str>>(v: &'a Value, tokens: &[S]) -> Option<&'a Value> {
    let mut cur = v;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get(t.as_ref())?,
            Value::Array(a) => a.get(t.as_ref().parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Sets (or, with `None`, removes) the object member at `tokens`, creating missing
/// parents as objects. Used on the working copy while generating operations.
fn set(v: &mut Value, tokens: &[String], new: Option<Value>) {
    let Some((last, parents)) = tokens.split_last() else {
        if let Some(n) = new {
            *v = n;
        }
        return;
    };
    let mut cur = v;
    for t in parents {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(m) = cur else { return };
        cur = m
            .entry(t.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !cur.is_object() {
        *cur = Value::Object(Map::new());
    }
    if let Value::Object(m) = cur {
        match new {
            Some(n) => {
                m.insert(last.clone(), n);
            }
            None => {
                m.remove(last);
            }
        }
    }
}

/// The operations that make `current` equal `desired` at every unit (in unit order) and
/// change nothing else. Values are copied verbatim from desired (CAPI compares strings
/// exactly: a re-encoded gzip+base64 content would not match).
///
/// - both present and different: `replace` (after `test` for key units);
/// - only desired: `add`, at the first missing parent with the missing objects built
///   around the value (RFC 6902 `add` needs the parent to exist);
/// - only current: `remove` (after `test` for key units).
pub fn operations(current: &Value, desired: &Value, units: &[Unit]) -> Vec<Value> {
    let mut work = current.clone();
    let mut ops = Vec::new();
    for u in units {
        let d = get(desired, &u.tokens).cloned();
        let c = get(&work, &u.tokens).cloned();
        match (c, d) {
            (Some(c), Some(d)) if c == d => {}
            (Some(c), Some(d)) => {
                if u.test_before {
                    ops.push(json!({"op": "test", "path": u.pointer(), "value": c}));
                }
                ops.push(json!({"op": "replace", "path": u.pointer(), "value": d}));
                set(&mut work, &u.tokens, Some(d));
            }
            (None, Some(d)) => {
                // First level whose member is missing or is not an object we can descend.
                let mut i = 0;
                while i + 1 < u.tokens.len()
                    && get(&work, &u.tokens[..=i]).is_some_and(Value::is_object)
                {
                    i += 1;
                }
                let mut value = d.clone();
                for t in u.tokens[i + 1..].iter().rev() {
                    let mut m = Map::new();
                    m.insert(t.clone(), value);
                    value = Value::Object(m);
                }
                ops.push(json!({"op": "add", "path": pointer(&u.tokens[..=i]), "value": value}));
                set(&mut work, &u.tokens, Some(d));
            }
            (Some(c), None) => {
                if u.test_before {
                    ops.push(json!({"op": "test", "path": u.pointer(), "value": c}));
                }
                ops.push(json!({"op": "remove", "path": u.pointer()}));
                set(&mut work, &u.tokens, None);
            }
            (None, None) => {}
        }
    }
    ops
}

/// Applies RFC 6902 operations to a copy of `doc` (with the `json-patch` crate, as an
/// independent check of what CAPI will do). Errors name the failing operation.
pub fn apply(doc: &Value, ops: &[Value]) -> Result<Value, String> {
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops.to_vec())).map_err(|e| e.to_string())?;
    let mut out = doc.clone();
    json_patch::patch(&mut out, &patch).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pointer_escapes() {
        assert_eq!(pointer(&["spec", "a/b", "c~d"]), "/spec/a~1b/c~0d");
    }

    #[test]
    fn add_builds_missing_parents() {
        let cur = json!({"spec": {}});
        let des = json!({"spec": {"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "a"}]}}}});
        let u = Unit::whole(&[
            "spec",
            "joinConfiguration",
            "nodeRegistration",
            "kubeletExtraArgs",
        ]);
        let ops = operations(&cur, &des, std::slice::from_ref(&u));
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/spec/joinConfiguration", "value": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "a"}]}}})
            ]
        );
        assert_eq!(apply(&cur, &ops).unwrap(), des);
    }

    #[test]
    fn key_units_test_first() {
        let cur = json!({"spec": {"m": {"a": "1", "b": "2"}}});
        let des = json!({"spec": {"m": {"a": "3", "c": "4"}}});
        let units: Vec<Unit> = ["a", "b", "c"]
            .iter()
            .map(|k| Unit::key(&["spec", "m", k]))
            .collect();
        let ops = operations(&cur, &des, &units);
        assert_eq!(
            ops,
            vec![
                json!({"op": "test", "path": "/spec/m/a", "value": "1"}),
                json!({"op": "replace", "path": "/spec/m/a", "value": "3"}),
                json!({"op": "test", "path": "/spec/m/b", "value": "2"}),
                json!({"op": "remove", "path": "/spec/m/b"}),
                json!({"op": "add", "path": "/spec/m/c", "value": "4"}),
            ]
        );
        assert_eq!(apply(&cur, &ops).unwrap(), des);
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            "[a-c]{0,2}".prop_map(Value::from),
            prop::collection::vec("[a-c]{0,2}".prop_map(Value::from), 0..3).prop_map(Value::Array),
        ]
    }

    /// Objects over a small key alphabet, so current and desired share keys often.
    fn tree() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop::collection::btree_map("[pqr/~]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect()))
        })
    }

    fn paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if let Value::Object(m) = v {
            for (k, x) in m {
                prefix.push(k.clone());
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
    }

    proptest! {
        /// For random current/desired pairs and a random set of covered units, applying
        /// the operations makes every unit equal to desired and changes nothing outside
        /// the units: exactly the uncovered differences stay.
        #[test]
        fn patch_covers_exactly_the_units(cur in tree(), des in tree(), pick in prop::collection::vec(any::<bool>(), 0..16), keys in any::<bool>()) {
            let cur = json!({"spec": cur});
            let des = json!({"spec": des});
            let mut all = Vec::new();
            paths(&cur["spec"], &mut vec![], &mut all);
            paths(&des["spec"], &mut vec![], &mut all);
            all.sort();
            all.dedup();
            // Disjoint units: drop any path under an already picked one.
            let mut units: Vec<Unit> = Vec::new();
            for (i, p) in all.iter().enumerate() {
                if !pick.get(i).copied().unwrap_or(false) { continue; }
                if units.iter().any(|u| p.starts_with(&u.tokens[1..]) || u.tokens[1..].starts_with(p)) { continue; }
                let mut t = vec!["spec".to_string()];
                t.extend(p.iter().cloned());
                units.push(Unit { tokens: t, test_before: keys });
            }
            let ops = operations(&cur, &des, &units);
            let out = apply(&cur, &ops).map_err(TestCaseError::fail)?;
            for u in &units {
                prop_assert_eq!(get(&out, &u.tokens), get(&des, &u.tokens), "unit {}", u.pointer());
            }
            // Outside the units, out equals current: blank the units on both and compare.
            let blank = |v: &Value| {
                let mut v = v.clone();
                for u in &units { set(&mut v, &u.tokens, None); }
                prune(&mut v);
                v
            };
            prop_assert_eq!(blank(&out), blank(&cur));
        }
    }

    /// Drops empty objects left behind by blanking, so an `add` that created parents
    /// compares equal to a current without them.
    fn prune(v: &mut Value) {
        if let Value::Object(m) = v {
            for x in m.values_mut() {
                prune(x);
            }
            m.retain(|_, x| !matches!(x, Value::Object(o) if o.is_empty()));
        }
    }
}
