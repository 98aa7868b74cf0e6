//! `--set key=value`: dotted paths into the YAML tree (the parameter sections may omit
//! `params.`), applied before the spec is read.

use serde_yaml_ng::Value;

use crate::error::{Error, Result};

/// The top-level fields of a spec (`Spec`'s; its own test checks the list against serde's).
pub(crate) const SPEC_FIELDS: &[&str] = &[
    "name",
    "description",
    "datasets",
    "supervision",
    "methods",
    "trials",
    "params",
    "targets",
    "executor",
    "remote",
];

/// Apply `--set key=value` overrides to the YAML tree; returns each overridden path (with
/// `params.` explicit) and its argument, for placing problems. A key starting with one of
/// `sections` (the parameter sections) means `params.KEY`.
pub fn apply_overrides(
    root: &mut Value,
    overrides: &[String],
    sections: &[&str],
) -> Result<Vec<(Vec<String>, String)>> {
    let mut placed = Vec::new();
    for o in overrides {
        let (key, raw) = o.split_once('=').ok_or_else(|| {
            Error::user(format!("`--set {o}` is not of the form key=value"))
                .hint("for example `--set constraints.corruption=0.5`")
        })?;
        let mut path: Vec<&str> = key.split('.').filter(|s| !s.is_empty()).collect();
        if path.is_empty() {
            return Err(Error::user(format!("`--set {o}`: empty key")));
        }
        // A misspelt parameter section (`trian.epochs`) is named against the sections and the
        // spec's own top-level keys together, before it could read as an unknown spec field.
        let mut top: Vec<String> = SPEC_FIELDS.iter().map(|f| f.to_string()).collect();
        if let Value::Mapping(m) = &*root {
            top.extend(m.keys().filter_map(|k| k.as_str().map(String::from)));
        }
        if path.len() > 1 && !sections.contains(&path[0]) && !top.iter().any(|t| t == path[0]) {
            let candidates = sections
                .iter()
                .copied()
                .chain(top.iter().map(String::as_str));
            if let Some(near) =
                crate::error::nearest(path[0], candidates).filter(|n| sections.contains(n))
            {
                return Err(
                    Error::user(format!("`--set {o}`: there is no section `{}`", path[0])).hint(
                        format!(
                            "did you mean `{near}.{}`? (parameter sections: {})",
                            path[1..].join("."),
                            sections.join(", ")
                        ),
                    ),
                );
            }
        }
        let with_params;
        if sections.contains(&path[0]) {
            with_params = std::iter::once("params")
                .chain(path.iter().copied())
                .collect::<Vec<_>>();
            path = with_params;
        }
        let value: Value = serde_yaml_ng::from_str(raw).map_err(|e| {
            Error::user(format!("`--set {o}`: value `{raw}` is not valid YAML: {e}"))
        })?;
        let set = set_path(root, &path, value, o)?;
        placed.push((set, o.clone()));
    }
    Ok(placed)
}

/// Set `value` at `path`, creating sections as needed. A key may itself contain dots
/// (`supervision.lv0.01.level`): at each level the longest run of segments naming an
/// existing key wins. Returns the path as keys.
pub(crate) fn set_path(
    root: &mut Value,
    path: &[&str],
    value: Value,
    arg: &str,
) -> Result<Vec<String>> {
    let mut node = root;
    let mut i = 0;
    let mut keys = Vec::new();
    while i < path.len() {
        if node.is_null() {
            *node = Value::Mapping(Default::default());
        }
        let Value::Mapping(map) = node else {
            return Err(Error::user(format!(
                "`--set {arg}`: `{}` is not a section, it cannot hold `{}`",
                path[..i].join("."),
                path[i]
            )));
        };
        let mut take = 1;
        for j in (i + 1..=path.len()).rev() {
            if map.contains_key(path[i..j].join(".").as_str()) {
                take = j - i;
                break;
            }
        }
        let key_s = path[i..i + take].join(".");
        keys.push(key_s.clone());
        let key = Value::String(key_s);
        i += take;
        if i == path.len() {
            map.insert(key, value);
            return Ok(keys);
        }
        if !map.contains_key(&key) {
            map.insert(key.clone(), Value::Null);
        }
        node = map.get_mut(&key).expect("present");
    }
    Ok(keys)
}

pub(crate) fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// A YAML value as JSON (what manifests and `upcc config --json` carry).
pub fn yaml_to_json(v: &Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
