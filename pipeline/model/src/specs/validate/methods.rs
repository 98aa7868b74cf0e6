//! Resolving a spec's methods: each entry's kind, the sections it may set, and its settings
//! (each method resolves and checks its own).

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml_ng::Value;

use crate::error::nearest;
use crate::method::{self, ResolvedMethod};
use crate::specs::resolver::Resolver;
use crate::specs::schema::SpecFile;
use crate::specs::source::Problems;

/// Resolve every method of the spec (`broken`: parameter sections already reported); those
/// with problems are left out.
pub(super) fn resolve_methods(
    file: &SpecFile,
    broken: &BTreeSet<String>,
    p: &mut Problems<'_>,
) -> BTreeMap<String, ResolvedMethod> {
    file.methods
        .iter()
        .filter_map(|(name, mv)| Some((name.clone(), resolve_method(file, broken, name, mv, p)?)))
        .collect()
}

/// Resolve method entry `name` (its mapping `mv`).
fn resolve_method(
    file: &SpecFile,
    broken: &BTreeSet<String>,
    name: &str,
    mv: &Value,
    p: &mut Problems<'_>,
) -> Option<ResolvedMethod> {
    let kinds = method::kinds();
    let mapping = match mv {
        Value::Null => Default::default(),
        Value::Mapping(m) => m.clone(),
        _ => {
            p.add(
                &["methods", name],
                format!("method `{name}` must be a mapping (`{{}}` for the defaults)"),
                None,
            );
            return None;
        }
    };
    let kind_name = match mapping.get("kind") {
        Some(Value::String(k)) => k.clone(),
        Some(_) => {
            p.add(
                &["methods", name, "kind"],
                format!("method `{name}`: `kind` must be a method name"),
                Some(format!("methods: {}", kinds.join(", "))),
            );
            return None;
        }
        None => name.to_string(),
    };
    let Some(m) = method::lookup(&kind_name) else {
        let explicit = mapping.contains_key("kind");
        p.add(
            &if explicit {
                vec!["methods", name, "kind"]
            } else {
                vec!["methods", name]
            },
            if explicit {
                format!("method `{name}`: unknown kind `{kind_name}`")
            } else {
                format!("method `{name}` is not a known method and sets no `kind`")
            },
            Some(format!(
                "{}known methods: {} (a method of another name needs `kind: probpair` or similar)",
                nearest(&kind_name, kinds.iter().copied())
                    .map(|n| format!("did you mean `{n}`? "))
                    .unwrap_or_default(),
                kinds.join(", ")
            )),
        );
        return None;
    };
    let mut own = BTreeMap::new();
    let mut ok = true;
    for (k, v) in &mapping {
        let Some(k) = k.as_str() else { continue };
        if k == "kind" {
            continue;
        }
        if !m.sections().contains(&k) {
            ok = false;
            let readers: Vec<&str> = method::REGISTRY
                .iter()
                .filter(|r| r.sections().contains(&k))
                .map(|r| r.kind())
                .collect();
            let others = if readers.is_empty() {
                nearest(k, m.sections().iter().copied())
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default()
            } else {
                format!(
                    "; `{k}` is read by {} (set `kind: {}`)",
                    readers.join(", "),
                    readers[0]
                )
            };
            p.add(
                &["methods", name, k],
                format!(
                    "method `{name}` ({}) sets `{k}`, which it does not read",
                    m.kind()
                ),
                Some(format!("it reads: {}{others}", m.sections().join(", "))),
            );
            continue;
        }
        own.insert(k.to_string(), v.clone());
    }
    if !ok {
        return None;
    }
    let mut cx = Resolver {
        problems: p,
        params: &file.params,
        broken,
        method: name,
        overrides: &own,
        resolved: BTreeMap::new(),
    };
    let settings = m.resolve(&mut cx)?;
    Some(ResolvedMethod {
        method: m,
        settings,
        sections: cx.resolved,
        own: own
            .iter()
            .map(|(k, v)| (k.clone(), crate::specs::overrides::yaml_to_json(v)))
            .collect(),
    })
}
