//! A loaded, validated spec.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::schema::{SpecFile, StageParams, SupervisionSpec};
use crate::method::ResolvedMethod;
use crate::targets::{ResolvedTarget, TargetKind};

/// A loaded, validated spec.
pub struct Spec {
    /// As given on the command line (for messages).
    pub display: String,
    pub dir: PathBuf,
    pub file: SpecFile,
    pub trials: Vec<u64>,
    pub params: StageParams,
    /// Resolved methods by name.
    pub methods: BTreeMap<String, ResolvedMethod>,
    /// Target names in the order the spec declares them (tables print in this order).
    pub target_order: Vec<String>,
    /// The `--set` overrides applied, in order.
    pub overrides: Vec<Override>,
    /// The YAML document as read, merge keys resolved and `--set` applied.
    pub document: serde_yaml_ng::Value,
    /// Oracle supervision settings derived for figure targets (`SUP.oracle` → oracle
    /// judgments under SUP's number of experts).
    pub oracle_runs: BTreeMap<String, SupervisionSpec>,
    /// Each dataset's shape as known at load (`expect:`, else the head of its file), for the
    /// memory check of the nodes that train on it.
    pub shapes: BTreeMap<String, Option<upcc_stages::features::Shape>>,
    /// Each target's kind, as validation looked up its `kind:`, what the kind resolved of the
    /// fields only it reads, and its published values.
    pub targets: BTreeMap<String, ResolvedTarget>,
}

impl Spec {
    /// The kind of target `name` (validated).
    pub fn kind(&self, name: &str) -> TargetKind {
        self.targets[name].kind
    }

    /// Target `name` as validation resolved it.
    pub fn target(&self, name: &str) -> &ResolvedTarget {
        &self.targets[name]
    }

    /// A supervision setting by name: the spec's own or a derived oracle run.
    pub fn supervision(&self, name: &str) -> &SupervisionSpec {
        self.file
            .supervision
            .get(name)
            .or_else(|| self.oracle_runs.get(name))
            .expect("validated supervision name")
    }
}

/// One `--set` as applied: the path it set (with `params.` explicit) and the argument.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    pub path: Vec<String>,
    pub arg: String,
}

impl Spec {
    /// One line per `--set` of a parameter section that some method's own entry shadows:
    /// `--set train.epochs=10` does not apply to `eci-pp`, whose `methods.eci-pp.train.epochs`
    /// wins (a method's own values win over `params`, however they were set).
    pub fn shadowed_overrides(&self) -> Vec<String> {
        let mut out = Vec::new();
        for o in &self.overrides {
            let [params, section, field, ..] = o.path.as_slice() else {
                continue;
            };
            if params != "params" {
                continue;
            }
            for (name, m) in &self.methods {
                let Some(own) = m.own.get(section).and_then(|s| s.get(field)) else {
                    continue;
                };
                let rest = o.path[3..].iter().fold(own, |v, k| v.get(k).unwrap_or(v));
                out.push(format!(
                    "`--set {}` does not apply to method `{name}`: its own `methods.{name}.{section}.{field}{}` = {} wins",
                    o.arg,
                    o.path[3..].iter().map(|k| format!(".{k}")).collect::<String>(),
                    rest
                ));
            }
        }
        out
    }

    /// The resolved spec (Hydra's saved config): the file after `--set`, its trials as seeds,
    /// the shared stage sections with every default filled in, and each method's sections as
    /// it trains with them (`params` merged with its own entry).
    pub fn resolved(&self) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let mut doc = match crate::specs::overrides::yaml_to_json(&self.document) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        doc.insert("trials".into(), json!(self.trials));
        let p = &self.params;
        let mut params = match doc.remove("params") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        let stage = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
        params.insert("expert".into(), stage(serde_json::to_value(&p.expert)));
        params.insert(
            "constraints".into(),
            stage(serde_json::to_value(&p.constraints)),
        );
        params.insert(
            "pretrain".into(),
            stage(serde_json::to_value(&p.pretrain.settings)),
        );
        params.insert("cluster".into(), stage(serde_json::to_value(&p.cluster)));
        params.insert("table".into(), stage(serde_json::to_value(&p.table)));
        doc.insert("params".into(), Value::Object(params));
        let methods: Map<String, Value> = self
            .methods
            .iter()
            .map(|(name, m)| {
                let mut e = Map::new();
                e.insert("kind".into(), json!(m.method.kind()));
                for (k, v) in &m.sections {
                    e.insert(k.clone(), v.clone());
                }
                (name.clone(), Value::Object(e))
            })
            .collect();
        doc.insert("methods".into(), Value::Object(methods));
        if !self.overrides.is_empty() {
            doc.insert(
                "overrides".into(),
                json!(self.overrides.iter().map(|o| &o.arg).collect::<Vec<_>>()),
            );
        }
        Value::Object(doc)
    }
}

impl Spec {
    /// Resolved file path of a dataset file or `embedded:NAME`.
    pub fn resolve_path(&self, path: &str) -> PathBuf {
        self.dir.join(path)
    }
}
