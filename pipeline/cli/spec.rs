//! Experiment specs: YAML files naming datasets, supervision settings, methods, trials,
//! stage parameters and targets (each a grid of cells).
//!
//! Loading validates once, up front, and reports every problem with file, line and the
//! nearest valid name. `--set key=value` overrides any parameter (dotted path; the stage
//! names `expert`, `constraints`, `pretrain`, `train`, `cluster`, `table` may omit `params.`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;
use upcc_report::{Metric, TableSettings};
use upcc_stages::cluster::ClusterSettings;
use upcc_stages::constraints::ConstraintSettings;
use upcc_stages::eci::EciSettings;
use upcc_stages::expert::ClassifierParams;
use upcc_stages::features::{DataFormat, HeaderMode, Scaling, Split, SplitKind};
use upcc_stages::pretrain::PretrainSettings;
use upcc_stages::train::{TrainSettings, Weighting};

use crate::error::{nearest, CliError, Result};

/// The embedded default spec (a copy of `experiments/smoke.yaml`).
pub const SMOKE_YAML: &str = include_str!("../../experiments/smoke.yaml");
/// The vendored MNIST sample (`embedded:mnist5k`).
pub const MNIST5K: &[u8] = include_bytes!("../../experiments/data/mnist5k.csv.gz");

/// Embedded datasets by name.
pub fn embedded(name: &str) -> Option<&'static [u8]> {
    match name {
        "mnist5k" => Some(MNIST5K),
        _ => None,
    }
}

const STAGE_SECTIONS: [&str; 7] = [
    "expert",
    "constraints",
    "pretrain",
    "train",
    "eci",
    "cluster",
    "table",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub datasets: BTreeMap<String, DatasetSpec>,
    pub supervision: BTreeMap<String, SupervisionSpec>,
    pub methods: BTreeMap<String, MethodSpec>,
    pub trials: Trials,
    #[serde(default)]
    pub params: ParamsSpec,
    pub targets: BTreeMap<String, TargetSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    pub format: DataFormat,
    /// Role → path (relative to the spec file) or `embedded:NAME`.
    pub files: BTreeMap<String, String>,
    #[serde(default = "default_label_column")]
    pub label_column: String,
    #[serde(default)]
    pub header: HeaderMode,
    #[serde(default)]
    pub scaling: Scaling,
    #[serde(default)]
    pub split: Option<Split>,
    #[serde(default)]
    pub n_classes: Option<usize>,
    #[serde(default = "default_embedding_dim")]
    pub embedding_dim: usize,
}

fn default_label_column() -> String {
    "last".into()
}
fn default_embedding_dim() -> usize {
    10
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SupervisionSpec {
    /// One expert trained on fraction `level` of each class (`lv0.01`).
    Single { level: f64 },
    /// Complementary experts (`multi3`).
    Multi {
        experts: usize,
        #[serde(default = "default_familiar")]
        familiar: f64,
        #[serde(default = "default_unfamiliar")]
        unfamiliar: f64,
    },
    /// Constraints supplied by the user (CSV `a,b,y[,expert]` or Parquet).
    File { path: String },
}

fn default_familiar() -> f64 {
    0.1
}
fn default_unfamiliar() -> f64 {
    0.0001
}

/// Methods this version implements.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum MethodKind {
    #[serde(rename = "probpair")]
    ProbPair,
    #[serde(rename = "weighted-probpair")]
    WeightedProbPair,
    #[serde(rename = "eci-pp")]
    EciPp,
}

impl MethodKind {
    pub const NAMES: [&'static str; 3] = ["probpair", "weighted-probpair", "eci-pp"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "probpair" => Some(MethodKind::ProbPair),
            "weighted-probpair" => Some(MethodKind::WeightedProbPair),
            "eci-pp" => Some(MethodKind::EciPp),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MethodKind::ProbPair => "probpair",
            MethodKind::WeightedProbPair => "weighted-probpair",
            MethodKind::EciPp => "eci-pp",
        }
    }

    /// Pair weights of the ProbPair loss (ECI-PP sets its own per phase).
    pub fn weighting(self) -> Weighting {
        match self {
            MethodKind::ProbPair | MethodKind::EciPp => Weighting::None,
            MethodKind::WeightedProbPair => Weighting::Kappa,
        }
    }
}

/// A method as the spec resolves it.
#[derive(Clone, Debug)]
pub struct ResolvedMethod {
    pub kind: MethodKind,
    pub train: TrainSettings,
    /// ECI-PP's own settings (`params.eci` merged with the method's `eci`).
    pub eci: Option<EciSettings>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    /// Defaults to the method's name.
    #[serde(default)]
    pub kind: Option<MethodKind>,
    /// Overrides of `params.train` for this method.
    #[serde(default)]
    pub train: Option<Value>,
    /// Overrides of `params.eci` (ECI-PP methods only).
    #[serde(default)]
    pub eci: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Trials {
    Count(u64),
    Seeds(Vec<u64>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParamsSpec {
    pub expert: ClassifierParams,
    pub constraints: ConstraintSettings,
    /// `PretrainSettings` plus `seed` (default 0) and `per_trial` (default false).
    pub pretrain: Option<Value>,
    pub train: Option<Value>,
    /// ECI-PP settings (`EciSettings`).
    pub eci: Option<Value>,
    pub cluster: ClusterSettings,
    pub table: TableSettings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    #[serde(default)]
    pub kind: TargetKind,
    #[serde(default)]
    pub title: Option<String>,
    pub grid: GridSpec,
    /// Axes spanning the columns (default: `method, pretrain`; `supervision` for experts).
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    #[serde(default = "default_metrics")]
    pub metrics: Vec<Metric>,
    #[serde(default = "default_splits")]
    pub splits: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// Clustering scores (ACC, NMI, ARI) of every cell, mean ± std over trials.
    #[default]
    Table,
    /// Test accuracy of the simulated experts (group mean for multi-expert settings).
    Experts,
    /// ECI-PP's held-out diagnostics per iteration, drawn as the paper's 8-panel figure.
    Figure,
}

impl TargetSpec {
    pub fn columns(&self) -> Vec<String> {
        match (&self.columns, &self.kind) {
            (Some(c), _) => c.clone(),
            (None, TargetKind::Experts) => vec!["supervision".into()],
            (None, _) => vec!["method".into(), "pretrain".into()],
        }
    }
}
fn default_metrics() -> Vec<Metric> {
    vec![Metric::Acc, Metric::Nmi, Metric::Ari]
}
fn default_splits() -> Vec<String> {
    vec!["train".into(), "test".into()]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridSpec {
    pub dataset: Vec<String>,
    pub supervision: Vec<String>,
    #[serde(default)]
    pub method: Vec<String>,
    #[serde(default = "default_pretrain")]
    pub pretrain: Vec<bool>,
    #[serde(default)]
    pub corruption: Option<Vec<f64>>,
    #[serde(default)]
    pub budget: Option<Vec<usize>>,
}

fn default_pretrain() -> Vec<bool> {
    vec![true]
}

/// Pretraining as the spec resolves it.
#[derive(Clone, Debug)]
pub struct PretrainSpec {
    pub settings: PretrainSettings,
    pub seed: u64,
    pub per_trial: bool,
}

/// A loaded, validated spec.
pub struct Spec {
    /// As given on the command line (for messages).
    pub display: String,
    pub dir: PathBuf,
    pub file: SpecFile,
    pub trials: Vec<u64>,
    pub pretrain: PretrainSpec,
    /// Resolved training settings per method.
    pub methods: BTreeMap<String, ResolvedMethod>,
    /// Target names in the order the spec declares them (tables print in this order).
    pub target_order: Vec<String>,
}

/// Where a file's text came from.
pub struct SpecSource {
    pub display: String,
    pub dir: PathBuf,
    pub text: String,
}

/// Read a spec file, or the embedded default for `smoke` when no such file exists.
pub fn read_source(arg: &str) -> Result<SpecSource> {
    let path = Path::new(arg);
    if path.exists() {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::user(format!("cannot read spec `{arg}`: {e}")))?;
        let dir = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."))
            .to_path_buf();
        return Ok(SpecSource {
            display: arg.to_string(),
            dir,
            text,
        });
    }
    if arg == "smoke" {
        return Ok(SpecSource {
            display: "embedded:smoke.yaml".into(),
            dir: PathBuf::from("."),
            text: SMOKE_YAML.to_string(),
        });
    }
    Err(CliError::user(format!("spec file `{arg}` not found"))
        .hint("give a path such as `experiments/smoke.yaml`, or `smoke` for the embedded default"))
}

/// Find the first line mentioning `token` (as a word) for messages that serde cannot place.
fn locate(text: &str, token: &str) -> Option<usize> {
    if token.is_empty() {
        return None;
    }
    text.lines()
        .position(|l| {
            let code = l.split('#').next().unwrap_or("");
            code.match_indices(token).any(|(i, _)| {
                let before = code[..i].chars().last();
                let after = code[i + token.len()..].chars().next();
                let word = |c: Option<char>| {
                    c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.')
                };
                !word(before) && !word(after)
            })
        })
        .map(|i| i + 1)
}

/// Turn a serde message into our message plus a "did you mean" hint.
fn explain_serde(msg: &str) -> (String, Option<String>) {
    // "unknown field `x`, expected one of `a`, `b`" / "unknown variant `x`, expected `a` or `b`"
    for kind in ["unknown field", "unknown variant"] {
        if let Some(pos) = msg.find(kind) {
            let rest = &msg[pos + kind.len()..];
            let rest = rest.split(" at line ").next().unwrap_or(rest);
            let bad = rest.split('`').nth(1).unwrap_or("");
            let expected: Vec<&str> = rest.split('`').skip(3).step_by(2).collect();
            let hint = nearest(bad, expected.iter().copied())
                .map(|n| format!("did you mean `{n}`?"))
                .or_else(|| {
                    (!expected.is_empty()).then(|| {
                        format!(
                            "valid: {}",
                            expected
                                .iter()
                                .map(|e| format!("`{e}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
                });
            let clean = msg.split(" at line ").next().unwrap_or(msg).to_string();
            return (clean, hint);
        }
    }
    (
        msg.split(" at line ").next().unwrap_or(msg).to_string(),
        None,
    )
}

fn serde_error(display: &str, text: &str, e: &serde_yaml_ng::Error) -> CliError {
    let msg = e.to_string();
    let (clean, hint) = explain_serde(&msg);
    let line = e.location().map(|l| l.line()).or_else(|| {
        let bad = msg.split('`').nth(1).unwrap_or("");
        locate(text, bad)
    });
    let col = e.location().map(|l| l.column());
    let place = match (line, col) {
        (Some(l), Some(c)) => format!("{display}:{l}:{c}"),
        (Some(l), None) => format!("{display}:{l}"),
        _ => display.to_string(),
    };
    let mut err = CliError::user(format!("{place}: {clean}"));
    if let Some(h) = hint {
        err = err.hint(h);
    }
    err
}

/// Apply `--set key=value` overrides to the YAML tree.
pub fn apply_overrides(root: &mut Value, overrides: &[String]) -> Result<()> {
    for o in overrides {
        let (key, raw) = o.split_once('=').ok_or_else(|| {
            CliError::user(format!("`--set {o}` is not of the form key=value"))
                .hint("for example `--set constraints.corruption=0.5`")
        })?;
        let mut path: Vec<&str> = key.split('.').filter(|s| !s.is_empty()).collect();
        if path.is_empty() {
            return Err(CliError::user(format!("`--set {o}`: empty key")));
        }
        let with_params;
        if STAGE_SECTIONS.contains(&path[0]) {
            with_params = std::iter::once("params")
                .chain(path.iter().copied())
                .collect::<Vec<_>>();
            path = with_params;
        }
        let value: Value = serde_yaml_ng::from_str(raw).map_err(|e| {
            CliError::user(format!("`--set {o}`: value `{raw}` is not valid YAML: {e}"))
        })?;
        set_path(root, &path, value, o)?;
    }
    Ok(())
}

/// Set `value` at `path`, creating sections as needed. A key may itself contain dots
/// (`supervision.lv0.01.level`): at each level the longest run of segments naming an
/// existing key wins.
fn set_path(root: &mut Value, path: &[&str], value: Value, arg: &str) -> Result<()> {
    let mut node = root;
    let mut i = 0;
    while i < path.len() {
        if node.is_null() {
            *node = Value::Mapping(Default::default());
        }
        let Value::Mapping(map) = node else {
            return Err(CliError::user(format!(
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
        let key = Value::String(path[i..i + take].join("."));
        i += take;
        if i == path.len() {
            map.insert(key, value);
            return Ok(());
        }
        if !map.contains_key(&key) {
            map.insert(key.clone(), Value::Null);
        }
        node = map.get_mut(&key).expect("present");
    }
    Ok(())
}

/// Load and validate a spec with overrides.
pub fn load(arg: &str, overrides: &[String]) -> Result<Spec> {
    let src = read_source(arg)?;
    let display = src.display.clone();
    let mut value: Value =
        serde_yaml_ng::from_str(&src.text).map_err(|e| serde_error(&display, &src.text, &e))?;
    let target_order: Vec<String> = value
        .get("targets")
        .and_then(|t| t.as_mapping())
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    // Pass 1: the file alone, so that errors point into it.
    let file: SpecFile =
        serde_yaml_ng::from_str(&src.text).map_err(|e| serde_error(&display, &src.text, &e))?;
    // Pass 2: with the command-line overrides.
    let file = if overrides.is_empty() {
        file
    } else {
        apply_overrides(&mut value, overrides)?;
        serde_yaml_ng::from_value(value).map_err(|e| {
            let (clean, hint) = explain_serde(&e.to_string());
            let mut err = CliError::user(format!(
                "after `--set {}`: {clean}",
                overrides.join(" --set ")
            ));
            if let Some(h) = hint {
                err = err.hint(h);
            }
            err
        })?
    };
    let mut spec = validate(src, file)?;
    spec.target_order = target_order;
    Ok(spec)
}

struct Problems<'a> {
    display: &'a str,
    text: &'a str,
    list: Vec<(Option<usize>, String, Option<String>)>,
}

impl Problems<'_> {
    /// A serde error of a section deserialised from a YAML value (no location of its own):
    /// locate the offending name in the file instead.
    fn add_serde(&mut self, section: &str, e: &serde_yaml_ng::Error) {
        let text = e.to_string();
        let (m, h) = explain_serde(&text);
        let token = text.split('`').nth(1).unwrap_or(section).to_string();
        self.add(&token, format!("`{section}`: {m}"), h);
    }

    fn add(&mut self, token: &str, message: String, hint: Option<String>) {
        self.list.push((locate(self.text, token), message, hint));
    }

    fn unknown(&mut self, what: &str, field: &str, name: &str, valid: &[&str]) {
        let hint = match nearest(name, valid.iter().copied()) {
            Some(n) => format!(
                "did you mean `{n}`? (defined {what}s: {})",
                valid.join(", ")
            ),
            None => format!(
                "defined {what}s: {}",
                if valid.is_empty() {
                    "none".into()
                } else {
                    valid.join(", ")
                }
            ),
        };
        self.add(
            name,
            format!("unknown {what} `{name}` in `{field}`"),
            Some(hint),
        );
    }

    fn into_result(self) -> Result<()> {
        if self.list.is_empty() {
            return Ok(());
        }
        let place = |line: Option<usize>| {
            line.map(|l| format!("{}:{l}", self.display))
                .unwrap_or_else(|| self.display.to_string())
        };
        if self.list.len() == 1 {
            let (line, msg, hint) = self.list.into_iter().next().expect("one");
            let mut e = CliError::user(format!("{}: {msg}", place(line)));
            if let Some(h) = hint {
                e = e.hint(h);
            }
            return Err(e);
        }
        let mut e = CliError::user(format!("{} has {} problems", self.display, self.list.len()));
        for (line, msg, hint) in self.list {
            e = e.cause(match hint {
                Some(h) => format!("{}: {msg} ({h})", place(line)),
                None => format!("{}: {msg}", place(line)),
            });
        }
        Err(e)
    }
}

fn merge(base: &mut Value, over: &Value) {
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

fn validate(src: SpecSource, file: SpecFile) -> Result<Spec> {
    let mut p = Problems {
        display: &src.display,
        text: &src.text,
        list: vec![],
    };
    if file.name.is_empty()
        || !file
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        p.add(
            &file.name,
            format!(
                "spec `name: {}` must be non-empty letters, digits, `-`, `_` or `.`",
                file.name
            ),
            None,
        );
    }
    // Datasets.
    for (name, d) in &file.datasets {
        let roles: BTreeSet<&str> = d.files.keys().map(|s| s.as_str()).collect();
        let separate = matches!(d.format, DataFormat::Idx | DataFormat::Npy);
        let (single, split): (&[&str], &[&str]) = if separate {
            (&["x", "y"], &["train_x", "train_y", "test_x", "test_y"])
        } else {
            (&["data"], &["train", "test"])
        };
        let ok =
            roles == single.iter().copied().collect() || roles == split.iter().copied().collect();
        if !ok {
            p.add(
                "files",
                format!("dataset `{name}`: `files` has roles {:?}", roles),
                Some(format!(
                    "a {:?} dataset needs {} or {}",
                    d.format,
                    single.join(" + "),
                    split.join(" + ")
                )),
            );
        }
        for (role, path) in &d.files {
            if let Some(e) = path.strip_prefix("embedded:") {
                if embedded(e).is_none() {
                    p.add(
                        path,
                        format!("dataset `{name}`: no embedded dataset `{e}`"),
                        Some("embedded datasets: mnist5k".into()),
                    );
                }
            } else if !src.dir.join(path).exists() {
                p.add(
                    path,
                    format!("dataset `{name}`: file `{path}` (role `{role}`) not found"),
                    Some(format!(
                        "paths are relative to the spec's folder `{}`",
                        src.dir.display()
                    )),
                );
            }
        }
        if let Some(s) = &d.split {
            if s.kind == SplitKind::Official && roles.contains(single[0]) {
                p.add(
                    "official",
                    format!(
                        "dataset `{name}`: `split: official` needs separate train and test files"
                    ),
                    None,
                );
            }
            if s.kind == SplitKind::Stratified && !(s.test_fraction > 0.0 && s.test_fraction < 1.0)
            {
                p.add(
                    "test_fraction",
                    format!(
                        "dataset `{name}`: `split.test_fraction` must be in (0, 1), got {}",
                        s.test_fraction
                    ),
                    None,
                );
            }
        }
        if d.embedding_dim == 0 {
            p.add(
                "embedding_dim",
                format!("dataset `{name}`: `embedding_dim` must be positive"),
                None,
            );
        }
        if let Scaling::Multiply(f) = d.scaling {
            if !f.is_finite() {
                p.add(
                    "multiply",
                    format!("dataset `{name}`: scaling factor must be finite"),
                    None,
                );
            }
        }
    }
    // Supervision.
    for (name, s) in &file.supervision {
        match s {
            SupervisionSpec::Single { level } => {
                if !(*level > 0.0 && *level <= 1.0) {
                    p.add(
                        "level",
                        format!("supervision `{name}`: `level` must be in (0, 1], got {level}"),
                        None,
                    );
                }
            }
            SupervisionSpec::Multi {
                experts,
                familiar,
                unfamiliar,
            } => {
                if *experts == 0 {
                    p.add(
                        "experts",
                        format!("supervision `{name}`: `experts` must be at least 1"),
                        None,
                    );
                }
                for (f, v) in [("familiar", familiar), ("unfamiliar", unfamiliar)] {
                    if !(*v > 0.0 && *v <= 1.0) {
                        p.add(
                            f,
                            format!("supervision `{name}`: `{f}` must be in (0, 1], got {v}"),
                            None,
                        );
                    }
                }
            }
            SupervisionSpec::File { path } => {
                if !src.dir.join(path).exists() {
                    p.add(
                        path,
                        format!("supervision `{name}`: constraints file `{path}` not found"),
                        None,
                    );
                }
            }
        }
    }
    // Trials.
    let trials: Vec<u64> = match &file.trials {
        Trials::Count(n) => (1..=*n).collect(),
        Trials::Seeds(s) => s.clone(),
    };
    if trials.is_empty() {
        p.add(
            "trials",
            "`trials` must name at least one trial".into(),
            Some("`trials: 5` (seeds 1..5) or `trials: [1, 2, 3]`".into()),
        );
    }
    if trials.iter().collect::<BTreeSet<_>>().len() != trials.len() {
        p.add("trials", "`trials` lists a seed twice".into(), None);
    }
    // Stage parameters given as free YAML: pretrain and train (+ per-method overrides).
    let mut pretrain = PretrainSpec {
        settings: PretrainSettings::default(),
        seed: 0,
        per_trial: false,
    };
    if let Some(v) = &file.params.pretrain {
        let mut v = v.clone();
        if let Value::Mapping(m) = &mut v {
            if let Some(s) = m.remove("seed") {
                match s.as_u64() {
                    Some(s) => pretrain.seed = s,
                    None => p.add(
                        "seed",
                        "`params.pretrain.seed` must be a non-negative integer".into(),
                        None,
                    ),
                }
            }
            if let Some(s) = m.remove("per_trial") {
                match s.as_bool() {
                    Some(b) => pretrain.per_trial = b,
                    None => p.add(
                        "per_trial",
                        "`params.pretrain.per_trial` must be true or false".into(),
                        None,
                    ),
                }
            }
        }
        match serde_yaml_ng::from_value::<PretrainSettings>(v) {
            Ok(s) => pretrain.settings = s,
            Err(e) => p.add_serde("params.pretrain", &e),
        }
    }
    let base_train = file
        .params
        .train
        .clone()
        .unwrap_or(Value::Mapping(Default::default()));
    let base_ok = match serde_yaml_ng::from_value::<TrainSettings>(base_train.clone()) {
        Ok(_) => true,
        Err(e) => {
            p.add_serde("params.train", &e);
            false
        }
    };
    let base_eci = file
        .params
        .eci
        .clone()
        .unwrap_or(Value::Mapping(Default::default()));
    let eci_ok = match serde_yaml_ng::from_value::<EciSettings>(base_eci.clone()) {
        Ok(_) => true,
        Err(e) => {
            p.add_serde("params.eci", &e);
            false
        }
    };
    let mut methods = BTreeMap::new();
    for (name, m) in &file.methods {
        let kind = match m.kind.or_else(|| MethodKind::from_name(name)) {
            Some(k) => k,
            None => {
                p.add(
                    name,
                    format!("method `{name}` is not a known method and sets no `kind`"),
                    Some(format!(
                        "{}known methods: {} (a method of another name needs `kind: probpair` or similar)",
                        nearest(name, MethodKind::NAMES).map(|n| format!("did you mean `{n}`? ")).unwrap_or_default(),
                        MethodKind::NAMES.join(", ")
                    )),
                );
                continue;
            }
        };
        let mut merged = base_train.clone();
        if let Some(o) = &m.train {
            merge(&mut merged, o);
        }
        let eci = if kind == MethodKind::EciPp {
            let mut merged = base_eci.clone();
            if let Some(o) = &m.eci {
                merge(&mut merged, o);
            }
            match serde_yaml_ng::from_value::<EciSettings>(merged) {
                Ok(s) => Some(s),
                Err(_) if !eci_ok => None,
                Err(e) => {
                    p.add_serde(&format!("methods.{name}.eci"), &e);
                    None
                }
            }
        } else {
            if m.eci.is_some() {
                p.add(
                    name,
                    format!(
                        "method `{name}` ({}) sets `eci`, which only ECI-PP methods read",
                        kind.name()
                    ),
                    Some("remove it, or set `kind: eci-pp`".into()),
                );
            }
            None
        };
        match serde_yaml_ng::from_value::<TrainSettings>(merged) {
            Ok(train) => {
                if kind != MethodKind::EciPp || eci.is_some() {
                    if let Some(e) = &eci {
                        if e.warmup_epochs > train.epochs {
                            p.add("warmup_epochs", format!("method `{name}`: `eci.warmup_epochs` ({}) exceeds `train.epochs` ({}), the total", e.warmup_epochs, train.epochs), None);
                        }
                        if e.folds < 2 {
                            p.add(
                                "folds",
                                format!("method `{name}`: `eci.folds` must be at least 2"),
                                None,
                            );
                        }
                    }
                    methods.insert(name.clone(), ResolvedMethod { kind, train, eci });
                }
            }
            // A problem of `params.train` itself is reported once, above.
            Err(_) if !base_ok => {}
            Err(e) => p.add_serde(&format!("methods.{name}.train"), &e),
        }
    }
    // Parameter ranges that a spec can get wrong.
    let c = &file.params.constraints;
    if !(0.0..=1.0).contains(&c.corruption) || !c.corruption.is_finite() {
        p.add(
            "corruption",
            format!(
                "`params.constraints.corruption` must be in [0, 1], got {}",
                c.corruption
            ),
            None,
        );
    }
    if c.budget == 0 {
        p.add(
            "budget",
            "`params.constraints.budget` must be at least 1".into(),
            None,
        );
    }
    // Targets.
    if file.targets.is_empty() {
        p.add(
            "targets",
            "the spec declares no targets".into(),
            Some("add `targets: {main: {grid: {...}}}`".into()),
        );
    }
    let (ds, sv, me) = (
        names_of(&file.datasets),
        names_of(&file.supervision),
        names_of(&file.methods),
    );
    for (t, target) in &file.targets {
        let g = &target.grid;
        let experts = target.kind == TargetKind::Experts;
        if experts && !g.method.is_empty() {
            p.add("method", format!("target `{t}` (kind: experts) is indexed by dataset and supervision only; remove `grid.method`"), None);
        }
        for (axis, values, valid, what) in [
            ("dataset", &g.dataset, &ds, "dataset"),
            ("supervision", &g.supervision, &sv, "supervision setting"),
            ("method", &g.method, &me, "method"),
        ] {
            if experts && axis == "method" {
                continue;
            }
            if values.is_empty() {
                p.add(axis, format!("target `{t}`: `grid.{axis}` is empty"), None);
            }
            for v in values {
                if !valid.contains(&v.as_str()) {
                    p.unknown(what, &format!("targets.{t}.grid.{axis}"), v, valid);
                }
            }
        }
        if let Some(cs) = &g.corruption {
            for c in cs {
                if !(0.0..=1.0).contains(c) {
                    p.add(
                        "corruption",
                        format!("target `{t}`: corruption {c} is outside [0, 1]"),
                        None,
                    );
                }
            }
        }
        if let Some(bs) = &g.budget {
            if bs.contains(&0) {
                p.add(
                    "budget",
                    format!("target `{t}`: a budget of 0 constraints"),
                    None,
                );
            }
        }
        if target.kind == TargetKind::Figure {
            for m in &g.method {
                if let Some(r) = methods.get(m) {
                    if r.kind != MethodKind::EciPp {
                        p.add(m, format!("target `{t}` (kind: figure) draws ECI-PP's diagnostics; method `{m}` ({}) records none", r.kind.name()), None);
                    }
                }
            }
        }
        for sup in &g.supervision {
            if experts
                && matches!(
                    file.supervision.get(sup),
                    Some(SupervisionSpec::File { .. })
                )
            {
                p.add(sup, format!("target `{t}` (kind: experts): supervision `{sup}` comes from a file and has no experts"), None);
            }
        }
        let axes = axes_of(target);
        for col in &target.columns() {
            if !axes.contains(&col.as_str()) {
                let hint = nearest(col, axes.iter().copied())
                    .map(|n| format!("did you mean `{n}`? (axes: {})", axes.join(", ")));
                p.add(
                    col,
                    format!("target `{t}`: column `{col}` is not an axis of its grid"),
                    hint.or_else(|| Some(format!("axes: {}", axes.join(", ")))),
                );
            }
        }
        for s in &target.splits {
            if s != "train" && s != "test" {
                p.add(
                    s,
                    format!("target `{t}`: split `{s}` must be `train` or `test`"),
                    None,
                );
            }
        }
        for (ax, vals) in [("pretrain", g.pretrain.len())] {
            if vals == 0 {
                p.add(ax, format!("target `{t}`: `grid.{ax}` is empty"), None);
            }
        }
        for sup in &g.supervision {
            if matches!(
                file.supervision.get(sup),
                Some(SupervisionSpec::File { .. })
            ) && (g.corruption.is_some() || g.budget.is_some())
            {
                p.add(sup, format!("target `{t}`: supervision `{sup}` comes from a file, so it cannot vary `corruption` or `budget`"), None);
            }
        }
    }
    p.into_result()?;
    Ok(Spec {
        display: src.display,
        dir: src.dir,
        file,
        trials,
        pretrain,
        methods,
        target_order: vec![],
    })
}

fn names_of<T>(m: &BTreeMap<String, T>) -> Vec<&str> {
    m.keys().map(|k| k.as_str()).collect()
}

/// The axes of a target's grid, in display order.
pub fn axes_of(target: &TargetSpec) -> Vec<&'static str> {
    let g = &target.grid;
    let mut a = vec!["dataset", "supervision"];
    if target.kind == TargetKind::Experts {
        return a;
    }
    if g.corruption.is_some() {
        a.push("corruption");
    }
    if g.budget.is_some() {
        a.push("budget");
    }
    a.push("method");
    a.push("pretrain");
    a
}

impl Spec {
    /// Resolved file path of a dataset file or `embedded:NAME`.
    pub fn resolve_path(&self, path: &str) -> PathBuf {
        self.dir.join(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_unknown_fields_with_the_nearest_name() {
        let (m, h) = explain_serde("params.constraints: unknown field `corruptoin`, expected one of `budget`, `corruption`, `diagnostic_pairs` at line 3 column 5");
        assert_eq!(m, "params.constraints: unknown field `corruptoin`, expected one of `budget`, `corruption`, `diagnostic_pairs`");
        assert_eq!(h.as_deref(), Some("did you mean `corruption`?"));
        let (_, h) = explain_serde("unknown field `qqq`, expected `aa` or `bb`");
        assert_eq!(h.as_deref(), Some("valid: `aa`, `bb`"));
    }

    #[test]
    fn locate_finds_whole_words_only() {
        let text = "a: probpair\nb: [probpar, x]\n";
        assert_eq!(locate(text, "probpar"), Some(2));
        assert_eq!(locate(text, "probpair"), Some(1));
    }

    #[test]
    fn overrides_create_and_replace_nested_keys() {
        let mut v: Value =
            serde_yaml_ng::from_str("params:\n  constraints:\n    corruption: 0.3\n").unwrap();
        apply_overrides(
            &mut v,
            &["constraints.corruption=0.5".into(), "train.epochs=3".into()],
        )
        .unwrap();
        assert_eq!(v["params"]["constraints"]["corruption"].as_f64(), Some(0.5));
        assert_eq!(v["params"]["train"]["epochs"].as_u64(), Some(3));
        assert!(apply_overrides(&mut v, &["nonsense".into()]).is_err());
        let mut w: Value =
            serde_yaml_ng::from_str("supervision:\n  lv0.01: {kind: single, level: 0.01}\n")
                .unwrap();
        apply_overrides(&mut w, &["supervision.lv0.01.level=0.1".into()]).unwrap();
        assert_eq!(w["supervision"]["lv0.01"]["level"].as_f64(), Some(0.1));
    }

    #[test]
    fn embedded_smoke_spec_loads() {
        let s = load("smoke", &[]).unwrap();
        assert_eq!(s.file.name, "smoke");
        assert!(!s.trials.is_empty());
    }
}
