//! Loading a spec: YAML (merge keys resolved), `--set` overrides, then every name and
//! parameter validated at once, before anything runs.

use serde_yaml_ng::Value;

use super::schema::*;
use super::spec::{Override, Spec};
use super::{overrides::*, source::*, validate::*};
use crate::error::{Error, Result};

/// Load and validate a spec with overrides.
pub fn load(arg: &str, overrides: &[String]) -> Result<Spec> {
    let src = read_source(arg)?;
    let display = src.display.clone();
    let mut value: Value =
        serde_yaml_ng::from_str(&src.text).map_err(|e| serde_error(&display, &src.text, &e))?;
    // YAML merge keys (`<<: *defaults`) are resolved before anything reads the spec.
    let merges = has_merge_keys(&value);
    if merges {
        value
            .apply_merge()
            .map_err(|e| serde_error(&display, &src.text, &e))?;
    }
    if !value.is_mapping() {
        return Err(Error::user(format!(
            "{display}:1: a spec is a mapping of `name`, `datasets`, `supervision`, `methods`, `trials`, `params` and `targets`; this file holds a {}",
            match value {
                Value::Sequence(_) => "list",
                Value::Null => "nothing",
                _ => "single value",
            }
        ))
        .hint("start from experiments/smoke.yaml"));
    }
    let target_order: Vec<String> = value
        .get("targets")
        .and_then(|t| t.as_mapping())
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    // Pass 1: the file alone, so that structural errors point into it (from the text, which
    // gives lines; a file with merge keys from its merged value).
    let file: SpecFile = if merges {
        serde_yaml_ng::from_value(value.clone())
    } else {
        serde_yaml_ng::from_str(&src.text)
    }
    .map_err(|e| serde_error(&display, &src.text, &e))?;
    // Pass 2: with the command-line overrides (structural errors then name the `--set`).
    let (file, placed) = if overrides.is_empty() {
        (file, vec![])
    } else {
        let placed = apply_overrides(&mut value, overrides, &super::sections::sections())?;
        let file = serde_yaml_ng::from_value(value.clone()).map_err(|e| {
            let (clean, hint) = explain_serde(&e.to_string());
            let mut err = Error::user(format!("`--set {}`: {clean}", overrides.join("` `--set ")));
            if let Some(h) = hint {
                err = err.hint(h);
            }
            err
        })?;
        (file, placed)
    };
    let applied: Vec<Override> = placed
        .iter()
        .map(|(path, arg)| Override {
            path: path.clone(),
            arg: arg.clone(),
        })
        .collect();
    let mut spec = validate(src, file, placed)?;
    spec.target_order = target_order;
    spec.overrides = applied;
    spec.document = value;
    Ok(spec)
}

/// Whether a YAML value holds a merge key `<<` anywhere.
pub(crate) fn has_merge_keys(v: &Value) -> bool {
    match v {
        Value::Mapping(m) => m
            .iter()
            .any(|(k, v)| k.as_str() == Some("<<") || has_merge_keys(v)),
        Value::Sequence(s) => s.iter().any(has_merge_keys),
        Value::Tagged(t) => has_merge_keys(&t.value),
        _ => false,
    }
}
