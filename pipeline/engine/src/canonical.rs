//! Canonical JSON: the one serialisation that node keys are hashed over.
//!
//! Object keys are sorted byte-wise at every depth, there is no insignificant whitespace, and
//! numbers are written by `serde_json` (shortest round-trip form for floats). We sort
//! explicitly rather than trusting `serde_json::Map`'s ordering, because any crate in the
//! graph may switch on serde_json's `preserve_order` feature.

use serde::Serialize;
use serde_json::Value;

/// Errors from canonicalisation.
#[derive(Debug, thiserror::Error)]
pub enum CanonicalError {
    #[error("value cannot be serialised: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("non-finite number at `{0}`: keys must not contain NaN or infinity")]
    NonFinite(String),
}

/// Serialise `value` canonically.
pub fn to_canonical_string<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    let v = serde_json::to_value(value)?;
    let mut out = String::new();
    write_value(&v, &mut out, "$")?;
    Ok(out)
}

/// Canonical form of an already-built JSON value.
pub fn value_to_canonical_string(v: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_value(v, &mut out, "$")?;
    Ok(out)
}

fn write_value(v: &Value, out: &mut String, path: &str) -> Result<(), CanonicalError> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                if !f.is_finite() {
                    return Err(CanonicalError::NonFinite(path.to_string()));
                }
            }
            out.push_str(&n.to_string())
        }
        Value::String(s) => out.push_str(&serde_json::to_string(s)?),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out, &format!("{path}[{i}]"))?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k)?);
                out.push(':');
                write_value(&map[k.as_str()], out, &format!("{path}.{k}"))?;
            }
            out.push('}');
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_at_every_depth() {
        let a = json!({"b": 1, "a": {"z": [1, 2], "y": "s"}});
        assert_eq!(
            value_to_canonical_string(&a).unwrap(),
            r#"{"a":{"y":"s","z":[1,2]},"b":1}"#
        );
    }

    #[test]
    fn floats_use_shortest_round_trip_form() {
        assert_eq!(to_canonical_string(&0.3f64).unwrap(), "0.3");
        assert_eq!(to_canonical_string(&1e-3f64).unwrap(), "0.001");
        assert_eq!(to_canonical_string(&3000u32).unwrap(), "3000");
    }

    #[test]
    fn structs_with_different_field_order_agree() {
        #[derive(Serialize)]
        struct A {
            x: u32,
            y: f64,
        }
        #[derive(Serialize)]
        struct B {
            y: f64,
            x: u32,
        }
        assert_eq!(
            to_canonical_string(&A { x: 1, y: 0.5 }).unwrap(),
            to_canonical_string(&B { y: 0.5, x: 1 }).unwrap()
        );
    }
}
