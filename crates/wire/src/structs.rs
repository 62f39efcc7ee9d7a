//! `google.protobuf.Struct` to and from JSON, as the KubeletConfiguration fields of a
//! NodeSpec carry it on the wire.

use std::collections::BTreeMap;

/// Converts a protobuf `Struct` into JSON. Numbers that are integral and within ±2^53 become
/// JSON integers (protobuf `Value` only has doubles; Kubernetes fields such as `maxPods` are
/// integers).
pub fn struct_to_json(s: &pbjson_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect(),
    )
}

/// Converts a JSON object into a protobuf `Struct`.
pub fn json_to_struct(m: &serde_json::Map<String, serde_json::Value>) -> pbjson_types::Struct {
    pbjson_types::Struct {
        fields: m
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect(),
    }
}

fn value_to_json(v: &pbjson_types::Value) -> serde_json::Value {
    use pbjson_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() <= 9_007_199_254_740_992.0 {
                serde_json::Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n)
                    .map(serde_json::Value::Number)
                    .unwrap_or(serde_json::Value::Null)
            }
        }
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
    }
}

fn json_to_value(v: &serde_json::Value) -> pbjson_types::Value {
    use pbjson_types::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(pbjson_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(m) => Kind::StructValue(json_to_struct(m)),
    };
    pbjson_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_numbers_stay_integers() {
        let mut m = serde_json::Map::new();
        m.insert("maxPods".into(), serde_json::json!(250));
        m.insert("ratio".into(), serde_json::json!(0.5));
        let back = struct_to_json(&json_to_struct(&m));
        assert_eq!(back, serde_json::json!({"maxPods": 250, "ratio": 0.5}));
    }
}
