//! Loading a spec: YAML (merge keys resolved), `--set` overrides, then every name and
//! parameter validated at once, before anything runs.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;
use upcc_stages::check::Check;

use super::*;
use super::{overrides::*, source::*, validate::*};
use crate::error::{CliError, Result};

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
        return Err(CliError::user(format!(
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
        let placed = apply_overrides(&mut value, overrides)?;
        let file = serde_yaml_ng::from_value(value).map_err(|e| {
            let (clean, hint) = explain_serde(&e.to_string());
            let mut err =
                CliError::user(format!("`--set {}`: {clean}", overrides.join("` `--set ")));
            if let Some(h) = hint {
                err = err.hint(h);
            }
            err
        })?;
        (file, placed)
    };
    let mut spec = validate(src, file, placed)?;
    spec.target_order = target_order;
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

/// A section of `params` as a settings type, checked; problems reported at `params.<name>`.
/// Take `seed` and `per_trial` out of section `name` (they choose the nodes, not the stage's
/// settings); the rest is the stage's.
pub(crate) fn take_sharing(
    p: &mut Problems,
    params: &mut BTreeMap<String, Value>,
    name: &str,
    default: Sharing,
) -> Sharing {
    let mut sharing = default;
    let Some(Value::Mapping(m)) = params.get_mut(name) else {
        return sharing;
    };
    if let Some(s) = m.remove("seed") {
        match s.as_u64() {
            Some(s) => sharing.seed = s,
            None => p.add(
                &["params", name, "seed"],
                format!("`params.{name}.seed` must be a whole number ≥ 0"),
                None,
            ),
        }
    }
    if let Some(s) = m.remove("per_trial") {
        match s.as_bool() {
            Some(b) => sharing.per_trial = b,
            None => p.add(
                &["params", name, "per_trial"],
                format!("`params.{name}.per_trial` must be true or false"),
                None,
            ),
        }
    }
    sharing
}

pub(crate) fn stage_section<T: DeserializeOwned + Check + Default>(
    p: &mut Problems,
    params: &BTreeMap<String, Value>,
    name: &str,
    broken: &mut BTreeSet<String>,
) -> T {
    let Some(v) = params.get(name).filter(|v| !v.is_null()) else {
        return T::default();
    };
    match serde_yaml_ng::from_value::<T>(v.clone()) {
        Ok(s) => {
            let problems = s.check();
            if !problems.is_empty() {
                broken.insert(name.to_string());
                p.add_checks(&["params", name], problems);
            }
            s
        }
        Err(e) => {
            broken.insert(name.to_string());
            p.add_serde(&["params", name], &e);
            T::default()
        }
    }
}
