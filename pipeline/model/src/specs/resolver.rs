//! Each method's settings sections: `params.<section>` merged with the method's own
//! override, deserialised and checked, problems placed at the one that set the field.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_yaml_ng::Value;
use upcc_stages::check::{Check, Problem};

use super::{overrides::*, source::*};

/// What a method sees while it resolves its settings: each section is `params.<section>`
/// merged with the method's own overrides, deserialised and checked; problems are placed at the
/// method's override when it set the value, else at `params`.
pub struct Resolver<'p, 'a> {
    pub(crate) problems: &'p mut Problems<'a>,
    pub(crate) params: &'p BTreeMap<String, Value>,
    /// Sections whose `params` value was already found broken (reported once there).
    pub(crate) broken: &'p BTreeSet<String>,
    pub(crate) method: &'p str,
    pub(crate) overrides: &'p BTreeMap<String, Value>,
    /// Each section as resolved (defaults, `params`, the method's own values), in JSON: what
    /// the method trains with, recorded with its results and printed by `upcc config`.
    pub(crate) resolved: BTreeMap<String, serde_json::Value>,
}

impl Resolver<'_, '_> {
    /// The method's settings of section `name`, checked; `None` after reporting problems.
    pub fn section<T: DeserializeOwned + Check + Serialize>(&mut self, name: &str) -> Option<T> {
        let base = self
            .params
            .get(name)
            .cloned()
            .unwrap_or(Value::Mapping(Default::default()));
        let base = if base.is_null() {
            Value::Mapping(Default::default())
        } else {
            base
        };
        let mut merged = base;
        let own = self.overrides.get(name);
        if let Some(o) = own {
            merge(&mut merged, o);
        }
        let path_own = ["methods", self.method, name];
        let path_params = ["params", name];
        match serde_yaml_ng::from_value::<T>(merged) {
            Ok(v) => {
                let problems = v.check();
                if problems.is_empty() {
                    if let Ok(json) = serde_json::to_value(&v) {
                        self.resolved.insert(name.to_string(), json);
                    }
                    return Some(v);
                }
                // Report each at the method's override if it set that field, else at params
                // (reported there once, not once per method).
                for p in problems {
                    let top = p.field.split(['.', '[']).next().unwrap_or("").to_string();
                    let by_method = own
                        .and_then(|o| o.as_mapping())
                        .is_some_and(|m| m.contains_key(top.as_str()));
                    if by_method {
                        self.problems.add_checks(&path_own, vec![p]);
                    } else if !self.broken.contains(name) {
                        self.problems.add_checks(&path_params, vec![p]);
                    }
                }
                None
            }
            Err(e) => {
                if own.is_some() {
                    self.problems.add_serde(&path_own, &e);
                } else if !self.broken.contains(name) {
                    self.problems.add_serde(&path_params, &e);
                }
                None
            }
        }
    }

    /// Report a problem with the method's section `section` (a cross-field rule).
    pub fn problem(&mut self, section: &str, p: Problem) {
        let top = p.field.split(['.', '[']).next().unwrap_or("").to_string();
        let by_method = self
            .overrides
            .get(section)
            .and_then(|o| o.as_mapping())
            .is_some_and(|m| m.contains_key(top.as_str()));
        if by_method {
            self.problems
                .add_checks(&["methods", self.method, section], vec![p]);
        } else {
            self.problems.add_checks(&["params", section], vec![p]);
        }
    }
}
