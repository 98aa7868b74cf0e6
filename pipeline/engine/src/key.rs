//! Node keys: exactly what decides whether a stored result can be reused.
//!
//! key = blake3("upcc-node-key\n" ‖ canonical JSON of [`KeyMaterial`]). The material lists the
//! stage name and its hand-bumped version, the fully resolved parameters, the *output* digests
//! of the inputs (so a rerun that reproduces the same bytes leaves dependents fresh: early
//! cutoff), the numerics class that can change output bits, and the key-schema version.
//! Provenance (hosts, times, git revisions) never enters the key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{to_canonical_string, CanonicalError};
use crate::digest::{Artifact, Digest, NodeKeyTag};

/// Bumped only when the meaning of key material changes; a tool upgrade never silently re-keys
/// the store.
pub const KEY_SCHEMA_VERSION: u32 = 1;

const KEY_DOMAIN: &[u8] = b"upcc-node-key\n";

/// Everything a node key is computed from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyMaterial {
    pub key_schema: u32,
    pub stage: String,
    pub stage_version: u32,
    pub params: Value,
    /// Input name → digest of the bytes consumed (an upstream output or a source file).
    pub inputs: BTreeMap<String, Digest<Artifact>>,
    /// For example `cpu-f32-avx512`; anything that changes output bits for the same inputs.
    pub numerics: String,
    /// The source files whose code computes the stage's outputs → blake3 of each, as the
    /// build that computes it was compiled from: editing a stage's code changes its key.
    /// Absent (and not in the key) for nodes that declare none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub code: BTreeMap<String, String>,
}

impl KeyChange {
    /// The source file this change is the code of (`code.<file>`), if it is one.
    pub fn code_file(&self) -> Option<&str> {
        self.field.strip_prefix("code.")
    }
}

impl KeyMaterial {
    /// Canonical JSON of the material; `-vv` and `explain` print exactly this.
    pub fn canonical_json(&self) -> Result<String, CanonicalError> {
        to_canonical_string(self)
    }

    /// The node key.
    pub fn digest(&self) -> Result<Digest<NodeKeyTag>, CanonicalError> {
        let json = self.canonical_json()?;
        let mut h = blake3::Hasher::new();
        h.update(KEY_DOMAIN);
        h.update(json.as_bytes());
        Ok(Digest::from_bytes(*h.finalize().as_bytes()))
    }
}

/// One difference between an earlier key and the current one: the answer to "why is this stale".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyChange {
    /// `stage_version`, `params.corruption`, `inputs.features`, `numerics`, ...
    pub field: String,
    pub before: Value,
    pub after: Value,
}

impl std::fmt::Display for KeyChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Value| match v {
            Value::String(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                format!("{}…", &s[..12])
            }
            Value::Null => "(absent)".to_string(),
            other => other.to_string(),
        };
        if let Some(file) = self.code_file() {
            write!(f, "code changed: {file}")
        } else if self.field == "code" {
            write!(f, "its stage's code is now recorded in the key")
        } else if self.field.starts_with("inputs.") {
            write!(
                f,
                "input `{}` changed ({} → {})",
                &self.field["inputs.".len()..],
                show(&self.before),
                show(&self.after)
            )
        } else if let Some(p) = self.field.strip_prefix("params.") {
            write!(
                f,
                "param `{p}` changed {} → {}",
                show(&self.before),
                show(&self.after)
            )
        } else {
            write!(
                f,
                "`{}` changed {} → {}",
                self.field,
                show(&self.before),
                show(&self.after)
            )
        }
    }
}

/// When `after` differs from `before` only in the code of the stage (no parameter, input,
/// version or numerics change): the code files that changed (`(first recorded)` where
/// `before` recorded no code).
pub fn code_changes(before: &KeyMaterial, after: &KeyMaterial) -> Option<Vec<String>> {
    let changes = diff(before, after);
    let files: Vec<String> = changes
        .iter()
        .filter_map(|c| {
            c.code_file()
                .map(String::from)
                .or_else(|| (c.field == "code").then(|| "(first recorded)".to_string()))
        })
        .collect();
    (!changes.is_empty() && files.len() == changes.len()).then_some(files)
}

/// Field-by-field differences between two key materials, leaves only, in a stable order.
pub fn diff(before: &KeyMaterial, after: &KeyMaterial) -> Vec<KeyChange> {
    let a = serde_json::to_value(before).unwrap_or(Value::Null);
    let b = serde_json::to_value(after).unwrap_or(Value::Null);
    let mut out = Vec::new();
    diff_values("", &a, &b, &mut out);
    out
}

fn diff_values(path: &str, a: &Value, b: &Value, out: &mut Vec<KeyChange>) {
    match (a, b) {
        (Value::Object(ma), Value::Object(mb)) => {
            let mut keys: Vec<&String> = ma.keys().chain(mb.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_values(
                    &p,
                    ma.get(k.as_str()).unwrap_or(&Value::Null),
                    mb.get(k.as_str()).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if a == b => {}
        _ => out.push(KeyChange {
            field: path.to_string(),
            before: a.clone(),
            after: b.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn material(corruption: f64, version: u32) -> KeyMaterial {
        KeyMaterial {
            key_schema: KEY_SCHEMA_VERSION,
            stage: "constraints".into(),
            stage_version: version,
            params: json!({"budget": 3000, "corruption": corruption}),
            inputs: BTreeMap::from([("expert".to_string(), Digest::of_bytes(b"x"))]),
            numerics: "cpu-f32".into(),
            code: BTreeMap::new(),
        }
    }

    #[test]
    fn same_material_same_key_and_any_change_changes_it() {
        assert_eq!(
            material(0.3, 1).digest().unwrap(),
            material(0.3, 1).digest().unwrap()
        );
        assert_ne!(
            material(0.3, 1).digest().unwrap(),
            material(0.5, 1).digest().unwrap()
        );
        assert_ne!(
            material(0.3, 1).digest().unwrap(),
            material(0.3, 2).digest().unwrap()
        );
    }

    #[test]
    fn diff_names_the_changed_parameter_and_version() {
        let d = diff(&material(0.3, 1), &material(0.5, 2));
        let fields: Vec<_> = d.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["params.corruption", "stage_version"]);
        assert_eq!(d[0].to_string(), "param `corruption` changed 0.3 → 0.5");
    }

    #[test]
    fn diff_reports_changed_inputs_by_name() {
        let mut b = material(0.3, 1);
        b.inputs.insert("expert".into(), Digest::of_bytes(b"y"));
        let d = diff(&material(0.3, 1), &b);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].to_string().starts_with("input `expert` changed"),
            "{}",
            d[0]
        );
    }
}
