//! Experiment specs: YAML files naming datasets, supervision settings, methods, trials,
//! stage parameters and targets (each a grid of cells).
//!
//! Loading validates everything up front, before anything runs: the file's structure, every
//! name, and every parameter through its settings type's `check` (each method resolves and
//! checks its own sections). Every problem is reported at once, each at the file and line that
//! holds the value, or at the `--set` argument that gave it. `--set key=value` overrides any
//! parameter (dotted path; the parameter sections may omit `params.`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml_ng::Value;
use upcc_report::{Metric, TableSettings};
use upcc_stages::check::{Check, Problem};
use upcc_stages::cluster::ClusterSettings;
use upcc_stages::constraints::ConstraintSettings;
use upcc_stages::expert::ClassifierParams;
use upcc_stages::features::{DataFormat, HeaderMode, Scaling, Split, SplitKind};
use upcc_stages::pretrain::PretrainSettings;

use crate::error::{nearest, CliError, Place, Problem as SpecProblem, Result};
use crate::method::{self, Method, Settings};

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

/// Sections of `params` every spec may set, besides the methods' own.
const STAGE_SECTIONS: [&str; 5] = ["expert", "constraints", "pretrain", "cluster", "table"];

/// Every parameter section: the stages' and the methods'.
pub fn sections() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = STAGE_SECTIONS.to_vec();
    v.extend(method::method_sections());
    v.sort_unstable();
    v.dedup();
    v
}

/// Larger embeddings are mistakes (and would not fit in memory with the usual backbone).
const MAX_EMBEDDING_DIM: usize = 100_000;

/// The most classes a dataset may declare (each is a column of every expert's output).
const MAX_CLASSES: usize = 1_000_000;

/// More trial × cell nodes than this is a mistake, not an experiment.
const MAX_NODES: u128 = 2_000_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub datasets: BTreeMap<String, DatasetSpec>,
    pub supervision: BTreeMap<String, SupervisionSpec>,
    /// Method name → `{kind: …, <section>: overrides…}` (checked against the method).
    pub methods: BTreeMap<String, Value>,
    /// A number of trials (seeds 1..N) or a list of seeds.
    pub trials: Value,
    /// Section → settings (checked against the stages and methods).
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
    pub targets: BTreeMap<String, TargetSpec>,
    /// How `upcc run` executes this spec's nodes (never part of any key).
    #[serde(default)]
    pub executor: Option<crate::slurm::ExecutorSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    pub format: DataFormat,
    /// Role → path (relative to the spec file) or `embedded:NAME`. A role named in `fetch`
    /// may give a path too: the local copy used when it has the right digest.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Role → where to download the file from, and its digest.
    #[serde(default)]
    pub fetch: BTreeMap<String, FetchSpec>,
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
    /// Training rows reserved for validation (the first this many of the training split):
    /// what the baselines' hyperparameter searches score. The paper reserves 1000.
    #[serde(default)]
    pub validation: usize,
    /// `split` (default): the first rows of the training split in its own order (shuffled
    /// for a stratified split, file order for official files); `rows`: in file row order.
    #[serde(default)]
    pub validation_order: upcc_stages::features::ValidationOrder,
    /// Which runs lose the validation rows: `search` (default) only the hyperparameter
    /// searches; `all` every training of the dataset.
    #[serde(default)]
    pub validation_scope: ValidationScope,
    /// What the paper says the dataset is (App. C.1): the features stage refuses files whose
    /// sizes differ, naming each difference.
    #[serde(default)]
    pub expect: Option<upcc_stages::features::Expected>,
    /// A mapping of the labels as read: `cifar100-coarse` (CIFAR-100's 20 superclasses).
    #[serde(default)]
    pub labels: Option<upcc_stages::features::LabelMap>,
}

/// Which trainings of a dataset hold its validation rows out (FIDELITY.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationScope {
    /// Only the search runs; final runs and every other method train on the whole training
    /// split (the paper: tuning on the split without the validation samples, then the final
    /// run on the full training split).
    #[default]
    Search,
    /// Every training of the dataset (the rows are reserved once, for everything).
    All,
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
    /// The oracle 1[t_a = t_b] through the same corruption channel, under `experts` nominal
    /// expert ids (the diagnostic run of the paper's Figure 3, panels G and H).
    Oracle {
        #[serde(default = "default_oracle_experts")]
        experts: usize,
    },
}

fn default_oracle_experts() -> usize {
    1
}

impl SupervisionSpec {
    /// Expert ids the constraints carry (file supervision: unknown before reading it).
    pub fn n_experts(&self) -> Option<usize> {
        match self {
            SupervisionSpec::Single { .. } => Some(1),
            SupervisionSpec::Multi { experts, .. } | SupervisionSpec::Oracle { experts } => {
                Some(*experts)
            }
            SupervisionSpec::File { .. } => None,
        }
    }

    /// Several expert ids (what the expert-aware ensembles need).
    pub fn is_multi_expert(&self) -> bool {
        self.n_experts().is_some_and(|e| e > 1)
    }
}

/// Where a figure's oracle-supervision panels (G, H) come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OraclePanels {
    /// A second ECI-PP run of each cell on oracle judgments through the same corruption
    /// channel (supervision `SUP.oracle`), read from that run's own diagnostics (the paper).
    #[default]
    Run,
    /// The expert-trained run's networks, scored against the corrupted oracle labels of the
    /// held-out pairs instead of the experts' (no second run).
    Relabel,
}

/// The supervision name of the oracle run derived for figure panels G and H.
pub fn oracle_run_name(sup: &str) -> String {
    format!("{sup}.oracle")
}

fn default_familiar() -> f64 {
    0.1
}
fn default_unfamiliar() -> f64 {
    0.0001
}

/// A method as the spec resolves it: the implementation and its checked settings.
#[derive(Clone)]
pub struct ResolvedMethod {
    pub method: &'static dyn Method,
    pub settings: Settings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    #[serde(default)]
    pub kind: TargetKind,
    #[serde(default)]
    pub title: Option<String>,
    pub grid: GridSpec,
    /// Axes spanning the columns (default: `method`, and `pretrain` when the grid has it;
    /// `supervision` for experts).
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    #[serde(default = "default_metrics")]
    pub metrics: Vec<Metric>,
    #[serde(default = "default_splits")]
    pub splits: Vec<String>,
    /// Figures only: where panels G and H come from (default: a run on oracle judgments).
    #[serde(default)]
    pub oracle_panels: Option<OraclePanels>,
    /// Tables only: published values to show reproduced − published against.
    #[serde(default)]
    pub published: Option<PublishedSpec>,
    /// Sweep figures only: the grid axis along the x axis (e.g. `supervision`, `corruption`,
    /// `budget`, or `method` over variants of one method).
    #[serde(default)]
    pub x: Option<String>,
    /// Sweep figures only: the grid axis with one line per value (default `method`; `none`:
    /// one line).
    #[serde(default)]
    pub lines: Option<String>,
    /// Sweep figures only: tick labels for x values (e.g. `eci-pp-k2: "2"` when x sweeps
    /// method variants); unlisted values show their names.
    #[serde(default)]
    pub x_labels: BTreeMap<String, String>,
    /// Sweep figures only: the x axis' title (default: the axis name).
    #[serde(default)]
    pub x_title: Option<String>,
}

/// A dataset file downloaded into the store: its URL and the digest that pins its bytes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FetchSpec {
    /// Where to download the file (absent when it comes in `parts`).
    #[serde(default)]
    pub url: Option<String>,
    /// SHA-256 of the file, hex.
    #[serde(default)]
    pub sha256: Option<String>,
    /// BLAKE3 of the file, hex.
    #[serde(default)]
    pub blake3: Option<String>,
    /// Git's blob id of the file (what `git hash-object FILE` prints: SHA-1 of
    /// `blob <length>\0` and the bytes), hex: how a file committed to a git repository is
    /// pinned.
    #[serde(default)]
    pub git_blob: Option<String>,
    /// A file published in parts (`x.pkl.part1`, `x.pkl.part2`, ...): each part downloaded
    /// and checked alone, then concatenated in this order.
    #[serde(default)]
    pub parts: Vec<FetchPart>,
}

/// One part of a file published in parts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FetchPart {
    pub url: String,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub blake3: Option<String>,
    #[serde(default)]
    pub git_blob: Option<String>,
}

/// A table target's published values: a CSV file
/// (`table,dataset,supervision,method,pretrain,corruption,budget,metric,split,value`), and how
/// the spec's names map onto the file's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedSpec {
    /// The CSV file, relative to the spec's folder.
    pub file: String,
    /// Which table of the file (its `table` column).
    pub table: String,
    /// What the deltas' heading calls the source (default: the file and table).
    #[serde(default)]
    pub source: Option<String>,
    /// Spec dataset → the file's dataset (default: the same name).
    #[serde(default)]
    pub datasets: BTreeMap<String, String>,
    /// Spec supervision → the file's (default: the same name).
    #[serde(default)]
    pub supervision: BTreeMap<String, String>,
    /// Spec method → the file's name for it (`sp-ea: SpherePair`; default: the method's kind
    /// for clustering tables, its name otherwise).
    #[serde(default)]
    pub methods: BTreeMap<String, String>,
    /// Columns not to match on (`pretrain`, `corruption`, `budget`): e.g. `[budget]` to hold
    /// a 3k-constraint run against the paper's 9k numbers.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// `table,row,column,value` files: which grid axis the file's rows and columns are
    /// (default: rows `dataset`, columns `supervision`; runtime tables: rows `method`,
    /// columns `dataset`).
    #[serde(default)]
    pub rows: Option<String>,
    #[serde(default)]
    pub columns: Option<String>,
    /// What the published values were measured on (runtime tables: the paper's GPU).
    #[serde(default)]
    pub device: Option<String>,
}

/// One row of a published clustering-scores file.
pub use upcc_report::published::PublishedScore as PublishedRow;

/// A table target's published values as loaded.
#[derive(Clone, Debug)]
pub struct PublishedTable {
    pub source: String,
    /// A clustering table's scores.
    pub rows: Vec<PublishedRow>,
    /// The values of a `table,row,column,value` file (experts, blind-spot, selection and
    /// runtime tables), as printed.
    pub printed: Vec<upcc_report::published::PrintedCell>,
    pub datasets: BTreeMap<String, String>,
    pub supervision: BTreeMap<String, String>,
    pub methods: BTreeMap<String, String>,
    pub ignore: Vec<String>,
    /// The grid axes the printed file's rows and columns are.
    pub row_axis: String,
    pub column_axis: String,
    pub device: Option<String>,
}

impl PublishedTable {
    /// The file's name for value `v` of axis `axis` (mapped by `datasets`, `supervision`,
    /// `methods`; unmapped values as they are).
    fn file_name<'a>(&'a self, axis: &str, v: &'a str) -> &'a str {
        let map = match axis {
            "dataset" => &self.datasets,
            "supervision" => &self.supervision,
            "method" => &self.methods,
            _ => return v,
        };
        map.get(v).map(|s| s.as_str()).unwrap_or(v)
    }

    /// The printed value of the cell at `coords` (a `table,row,column,value` file).
    pub fn printed_at(&self, coords: &BTreeMap<String, String>) -> Option<&str> {
        let row = self.file_name(&self.row_axis, coords.get(&self.row_axis)?);
        let col = self.file_name(&self.column_axis, coords.get(&self.column_axis)?);
        self.printed
            .iter()
            .find(|c| c.row == row && c.column == col)
            .map(|c| c.text.as_str())
    }

    /// The rows a cell matches: its dataset, supervision and method kind (mapped), and its
    /// pretraining, corruption and budget unless ignored.
    pub fn matching<'a>(
        &'a self,
        dataset: &str,
        supervision: &str,
        method_kind: &str,
        pretrain: bool,
        corruption: f64,
        budget: usize,
    ) -> impl Iterator<Item = &'a PublishedRow> + 'a {
        let ds = self
            .datasets
            .get(dataset)
            .cloned()
            .unwrap_or_else(|| dataset.to_string());
        let sup = self
            .supervision
            .get(supervision)
            .cloned()
            .unwrap_or_else(|| supervision.to_string());
        let method = method_kind.to_string();
        let ignored = |c: &str| self.ignore.iter().any(|i| i == c);
        let (ip, ic, ib) = (
            ignored("pretrain"),
            ignored("corruption"),
            ignored("budget"),
        );
        self.rows.iter().filter(move |r| {
            r.dataset == ds
                && r.supervision == sup
                && r.method == method
                && (ip || r.pretrain == pretrain)
                && (ic || (r.corruption - corruption).abs() < 1e-9)
                && (ib || r.budget == budget)
        })
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    /// Clustering scores (ACC, NMI, ARI) of every cell, mean ± std over trials.
    #[default]
    Table,
    /// Test accuracy of the simulated experts (group mean for multi-expert settings).
    Experts,
    /// ECI-PP's held-out diagnostics per iteration, drawn as the paper's 8-panel figure.
    Figure,
    /// The hyperparameter each cell's search chose by validation ACC (VolMaxDCC's λ, the
    /// ensembles' α: the paper's Tables 5 and 6); one value per cell, no trials.
    Selection,
    /// A clustering metric (mean ± spread over trials) against one axis of the grid (`x`),
    /// one line per value of another (`lines`, default `method`), a panel per metric and per
    /// value of the remaining axes: the paper's robustness and sensitivity figures.
    Sweep,
    /// The unfamiliar-class counts of each setting's experts, e.g. `(4,3,3)`: the paper's
    /// Table 2, read from the trained experts.
    BlindSpots,
    /// Histograms of the recorded constraint values of each setting (clean and corrupted
    /// records stacked): the paper's constraint-value distribution figure.
    ConstraintValues,
    /// Wall-clock training time of each cell (pretraining and searches included), read from
    /// the manifests' recorded times: the paper's Table 11.
    Runtime,
}

impl TargetKind {
    /// The name a spec writes (`kind: blind-spots`).
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Table => "table",
            TargetKind::Experts => "experts",
            TargetKind::Figure => "figure",
            TargetKind::Selection => "selection",
            TargetKind::Sweep => "sweep",
            TargetKind::BlindSpots => "blind-spots",
            TargetKind::ConstraintValues => "constraint-values",
            TargetKind::Runtime => "runtime",
        }
    }

    /// Indexed by dataset and supervision only (no methods train for it).
    pub fn per_setting(self) -> bool {
        matches!(
            self,
            TargetKind::Experts | TargetKind::BlindSpots | TargetKind::ConstraintValues
        )
    }

    /// Drawn (PNG, SVG and the plotted values) rather than tabulated.
    pub fn is_figure(self) -> bool {
        matches!(
            self,
            TargetKind::Figure | TargetKind::Sweep | TargetKind::ConstraintValues
        )
    }
}

impl TargetSpec {
    pub fn columns(&self) -> Vec<String> {
        match (&self.columns, &self.kind) {
            (Some(c), _) => c.clone(),
            (
                None,
                TargetKind::Experts
                | TargetKind::Selection
                | TargetKind::BlindSpots
                | TargetKind::ConstraintValues,
            ) => vec!["supervision".into()],
            // The paper's Table 11: a column per dataset, a row per method.
            (None, TargetKind::Runtime) => vec!["dataset".into()],
            (None, _) if self.grid.pretrain.is_some() => vec!["method".into(), "pretrain".into()],
            (None, _) => vec!["method".into()],
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
    /// Pretraining as an axis; absent: every method as the paper's main table runs it
    /// (pretrained where the method has pretraining, VanillaDCC and VolMaxDCC without) and
    /// no `pretrain` axis in the table.
    #[serde(default)]
    pub pretrain: Option<Vec<bool>>,
    #[serde(default)]
    pub corruption: Option<Vec<f64>>,
    #[serde(default)]
    pub budget: Option<Vec<usize>>,
}

impl GridSpec {
    /// The pretraining values a method runs under in this grid.
    pub fn pretrain_for(&self, pretrainable: bool) -> Vec<bool> {
        match &self.pretrain {
            Some(v) => v.clone(),
            None => vec![pretrainable],
        }
    }
}

/// Whether a stage's result is computed once and shared by every trial (with its own `seed`)
/// or once per trial (seeded by the trial): `seed` and `per_trial` in its section.
#[derive(Clone, Copy, Debug)]
pub struct Sharing {
    pub seed: u64,
    pub per_trial: bool,
}

impl Sharing {
    /// The seed a trial's node of this stage uses.
    pub fn seed_for(&self, trial: u64) -> u64 {
        if self.per_trial {
            trial
        } else {
            self.seed
        }
    }

    /// The node id suffix: `tN` per trial, `sN` shared.
    pub fn id_for(&self, trial: u64) -> String {
        if self.per_trial {
            format!("t{trial}")
        } else {
            format!("s{}", self.seed)
        }
    }
}

/// Pretraining as the spec resolves it.
#[derive(Clone, Debug)]
pub struct PretrainSpec {
    pub settings: PretrainSettings,
    pub sharing: Sharing,
}

/// The stage sections every method shares, checked.
#[derive(Clone, Debug)]
pub struct StageParams {
    pub expert: ClassifierParams,
    /// One set of experts per (dataset, supervision) shared by the trials, or one per trial.
    pub expert_sharing: Sharing,
    pub constraints: ConstraintSettings,
    pub pretrain: PretrainSpec,
    pub cluster: ClusterSettings,
    pub table: TableSettings,
}

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
    /// Oracle supervision settings derived for figure targets (`SUP.oracle` → oracle
    /// judgments under SUP's number of experts).
    pub oracle_runs: BTreeMap<String, SupervisionSpec>,
    /// Published values of table targets that name them, by target.
    pub published: BTreeMap<String, PublishedTable>,
    /// Each dataset's shape as known at load (`expect:`, else the head of its file), for the
    /// memory check of the nodes that train on it.
    pub shapes: BTreeMap<String, Option<upcc_stages::features::Shape>>,
}

impl Spec {
    /// A supervision setting by name: the spec's own or a derived oracle run.
    pub fn supervision(&self, name: &str) -> &SupervisionSpec {
        self.file
            .supervision
            .get(name)
            .or_else(|| self.oracle_runs.get(name))
            .expect("validated supervision name")
    }
}

/// What is known of a dataset's shape at load: `expect:`'s sizes, else the head of its local
/// file (CSV, IDX, `.npy`; not Parquet or pickles, nor files not downloaded yet).
fn dataset_shape(d: &DatasetSpec, dir: &Path) -> Option<upcc_stages::features::Shape> {
    if let Some(e) = &d.expect {
        if let Some(dim) = e.dim {
            return Some(upcc_stages::features::Shape { dim, rows: e.train });
        }
    }
    let (single, split) = d.format.roles();
    let role = [single[0], split[0]]
        .into_iter()
        .find(|r| d.files.contains_key(*r))?;
    let file = &d.files[role];
    match file.strip_prefix("embedded:") {
        Some(e) => upcc_stages::features::peek_shape(d.format, None, embedded(e), &d.label_column),
        None => upcc_stages::features::peek_shape(
            d.format,
            Some(&dir.join(file)),
            None,
            &d.label_column,
        ),
    }
}

/// The largest spec file read (64 MiB; the paper's spec is 60 KiB).
const MAX_SPEC_BYTES: u64 = 64 << 20;

/// The longest spec name (it names a folder of the store).
pub const MAX_SPEC_NAME: usize = 100;

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
        // A spec is a small text file: not a device or pipe that never ends, nor a dump.
        let meta = std::fs::metadata(path)
            .map_err(|e| CliError::user(format!("cannot read spec `{arg}`: {e}")))?;
        if !meta.is_file() {
            return Err(CliError::user(format!(
                "spec `{arg}` is not a regular file ({})",
                if meta.is_dir() {
                    "a directory"
                } else {
                    "a device, pipe or socket"
                }
            ))
            .hint("give the path of a YAML file such as `experiments/smoke.yaml`"));
        }
        if meta.len() > MAX_SPEC_BYTES {
            return Err(CliError::user(format!(
                "spec `{arg}` is {} bytes; a spec is at most {} MiB of YAML",
                meta.len(),
                MAX_SPEC_BYTES >> 20
            ))
            .hint("is this the right file? Data belongs in the files a dataset names"));
        }
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

// ---- placing problems -------------------------------------------------------------------

/// Find the first line mentioning `token` (as a word).
fn locate(text: &str, token: &str) -> Option<usize> {
    if token.is_empty() {
        return None;
    }
    text.lines()
        .position(|l| {
            let code = l.split('#').next().unwrap_or("");
            has_word(code, token)
        })
        .map(|i| i + 1)
}

fn has_word(code: &str, token: &str) -> bool {
    code.match_indices(token).any(|(i, _)| {
        let before = code[..i].chars().last();
        let after = code[i + token.len()..].chars().next();
        let word = |c: Option<char>| {
            c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.')
        };
        !word(before) && !word(after)
    })
}

/// The 1-based line of the key at `path` (block mappings by indentation, and keys written in
/// a flow mapping `{a: 1, b: 2}` on their parent's line). The deepest part of the path found
/// wins, so a missing leaf still places the problem at its section.
pub fn locate_path(text: &str, path: &[&str]) -> Option<usize> {
    locate_depth(text, path).map(|(_, line)| line)
}

/// [`locate_path`] with how many keys of `path` the line found matches.
fn locate_depth(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut best: Option<(usize, usize)> = None; // (depth matched, line)
    for (i, raw) in text.lines().enumerate() {
        let code = raw.split(" #").next().unwrap_or(raw);
        if code.trim().is_empty() || code.trim_start().starts_with('#') {
            continue;
        }
        let indent = code.len() - code.trim_start().len();
        let body = code.trim_start().trim_start_matches("- ");
        let Some((key, rest)) = body.split_once(':') else {
            continue;
        };
        let key = key
            .trim()
            .trim_matches(|c| c == '"' || c == '\'')
            .to_string();
        if key.contains(' ') || key.contains('{') {
            continue;
        }
        while stack.last().is_some_and(|(ind, _)| *ind >= indent) {
            stack.pop();
        }
        stack.push((indent, key));
        let keys: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        let depth = keys.len();
        if depth <= path.len() && keys == path[..depth] {
            if best.is_none_or(|(d, _)| depth > d) {
                best = Some((depth, i + 1));
            }
            // Deeper keys in a flow mapping on this line.
            let mut d = depth;
            let rest = rest.trim();
            while d < path.len() && rest.contains('{') && has_word(rest, path[d]) {
                d += 1;
            }
            if d > depth && best.is_none_or(|(bd, _)| d > bd) {
                best = Some((d, i + 1));
            }
        }
    }
    best
}

/// Places problems at a line of the spec, or at the `--set` argument that gave the value.
pub struct Locator<'a> {
    display: &'a str,
    text: &'a str,
    /// Paths set by `--set` (with `params.` made explicit) and the argument as given.
    overrides: Vec<(Vec<String>, String)>,
}

impl Locator<'_> {
    /// The `--set ARG` if the value at `path` came from one, else `file:line` (or `file`).
    pub fn place(&self, path: &[&str]) -> Place {
        for (p, arg) in self.overrides.iter().rev() {
            let n = p.len().min(path.len());
            if p[..n].iter().zip(&path[..n]).all(|(a, b)| a == b) {
                return Place::Set { arg: arg.clone() };
            }
        }
        // An entry the file does not have (a dataset only `--set` creates): the `--set` that
        // made it.
        if path.len() >= 2 && locate_depth(self.text, &path[..2]).is_none_or(|(d, _)| d < 2) {
            for (p, arg) in self.overrides.iter().rev() {
                if p.len() >= 2 && p[..2].iter().zip(&path[..2]).all(|(a, b)| a == b) {
                    return Place::Set { arg: arg.clone() };
                }
            }
        }
        let file = self.display.to_string();
        match locate_path(self.text, path)
            .or_else(|| path.last().and_then(|t| locate(self.text, t)))
        {
            Some(line) => Place::Line { file, line },
            None => Place::File { file },
        }
    }
}

struct Problems<'a> {
    at: Locator<'a>,
    list: Vec<SpecProblem>,
}

impl Problems<'_> {
    fn add(&mut self, path: &[&str], message: impl Into<String>, hint: Option<String>) {
        let entry = SpecProblem {
            place: self.at.place(path),
            field: path.join("."),
            message: message.into(),
            hint,
        };
        // Several methods reading one broken section find the same problem: report it once.
        if !self.list.contains(&entry) {
            self.list.push(entry);
        }
    }

    /// A serde error of the value at `path` (a section deserialised on its own).
    fn add_serde(&mut self, path: &[&str], e: &serde_yaml_ng::Error) {
        let text = e.to_string();
        let (m, h) = explain_serde(&text);
        let token = text.split('`').nth(1).unwrap_or("");
        let mut full: Vec<&str> = path.to_vec();
        if text.contains("unknown field") && !token.is_empty() {
            full.push(token);
        }
        let field = path.join(".");
        self.add(&full, format!("`{field}`: {m}"), h);
    }

    /// The problems a settings type's `check` found, under section path `path`.
    fn add_checks(&mut self, path: &[&str], problems: Vec<Problem>) {
        for p in problems {
            let field_path: Vec<String> = p
                .field
                .split('.')
                .map(|s| s.split('[').next().unwrap_or(s).to_string())
                .collect();
            let mut full: Vec<&str> = path.to_vec();
            full.extend(field_path.iter().map(|s| s.as_str()));
            let name = format!("{}.{}", path.join("."), p.field);
            self.add(&full, format!("`{name}` {}", p.message), None);
        }
    }

    fn unknown(&mut self, path: &[&str], what: &str, name: &str, valid: &[&str]) {
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
            path,
            format!("unknown {what} `{name}` in `{}`", path.join(".")),
            Some(hint),
        );
    }

    fn into_result(self, display: &str) -> Result<()> {
        if self.list.is_empty() {
            return Ok(());
        }
        Err(CliError::problems(display, self.list))
    }
}

/// Turn a serde message into what the user wrote wrong and what is valid, plus a hint.
fn explain_serde(msg: &str) -> (String, Option<String>) {
    let clean = msg.split(" at line ").next().unwrap_or(msg).to_string();
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
            return (clean, hint);
        }
    }
    // Integers too large for any field.
    if let Some(pos) = clean.find(" as u128") {
        let n = clean[..pos].rsplit('`').nth(1).unwrap_or("").to_string();
        let prefix = clean.split("invalid type").next().unwrap_or("");
        return (
            format!("{prefix}the number {n} is far too large for this field"),
            None,
        );
    }
    // YAML reads a number beyond f64's range (`1e400`) as a string.
    if let Some(pos) = clean.find("invalid type: string \"") {
        let rest = &clean[pos + "invalid type: string \"".len()..];
        if let Some((word, tail)) = rest.split_once('"') {
            let numeric = word
                .parse::<f64>()
                .is_ok_and(|v| !v.is_finite() && !word.to_ascii_lowercase().contains("inf"));
            if numeric && tail.contains("expected f64") {
                return (
                    format!(
                        "{}`{word}` is not a finite number (beyond ±1.8e308)",
                        &clean[..pos]
                    ),
                    Some("give a value in the field's range".into()),
                );
            }
        }
    }
    // Internal type names are not what the user wrote.
    let clean = clean
        .replace("expected usize", "expected a whole number ≥ 0")
        .replace("expected u64", "expected a whole number ≥ 0")
        .replace("expected u8", "expected a small whole number")
        .replace("expected f64", "expected a number")
        .replace("expected a sequence", "expected a list [..]");
    (clean, None)
}

fn serde_error(display: &str, text: &str, e: &serde_yaml_ng::Error) -> CliError {
    let msg = e.to_string();
    let (clean, hint) = explain_serde(&msg);
    let mut line = e.location().map(|l| l.line()).or_else(|| {
        let bad = msg.split('`').nth(1).unwrap_or("");
        locate(text, bad)
    });
    let mut col = e.location().map(|l| l.column());
    let mut hint = hint;
    // serde_yaml reports duplicate keys at the document start: find the second occurrence.
    if let Some(key) = msg
        .strip_prefix("duplicate entry with key \"")
        .and_then(|r| r.split('"').next())
    {
        let hits: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| {
                let t = l.trim_start().trim_start_matches("- ");
                t.starts_with(&format!("{key}:")) || t.starts_with(&format!("\"{key}\":"))
            })
            .map(|(i, _)| i + 1)
            .collect();
        if hits.len() >= 2 {
            line = Some(hits[1]);
            col = None;
            hint = Some(format!(
                "`{key}` is also defined at line {}; keep one",
                hits[0]
            ));
        }
    }
    if msg.contains("repetition limit exceeded") {
        hint = Some("the file's aliases (`*name`) expand to too many values (a \"billion laughs\"); a spec needs a few aliases at most".into());
    }
    if msg.contains("cannot start any token") {
        if let Some(l) = line {
            if text
                .lines()
                .nth(l.saturating_sub(1))
                .is_some_and(|s| s.contains('\t'))
            {
                hint = Some("YAML does not allow tabs: indent with spaces".into());
            }
        }
    }
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

// ---- overrides ----------------------------------------------------------------------------

/// Apply `--set key=value` overrides to the YAML tree; returns each overridden path (with
/// `params.` explicit) and its argument, for placing problems.
pub fn apply_overrides(
    root: &mut Value,
    overrides: &[String],
) -> Result<Vec<(Vec<String>, String)>> {
    let sections = sections();
    let mut placed = Vec::new();
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
        if sections.contains(&path[0]) {
            with_params = std::iter::once("params")
                .chain(path.iter().copied())
                .collect::<Vec<_>>();
            path = with_params;
        }
        let value: Value = serde_yaml_ng::from_str(raw).map_err(|e| {
            CliError::user(format!("`--set {o}`: value `{raw}` is not valid YAML: {e}"))
        })?;
        let set = set_path(root, &path, value, o)?;
        placed.push((set, o.clone()));
    }
    Ok(placed)
}

/// Set `value` at `path`, creating sections as needed. A key may itself contain dots
/// (`supervision.lv0.01.level`): at each level the longest run of segments naming an
/// existing key wins. Returns the path as keys.
fn set_path(root: &mut Value, path: &[&str], value: Value, arg: &str) -> Result<Vec<String>> {
    let mut node = root;
    let mut i = 0;
    let mut keys = Vec::new();
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

// ---- resolving methods ----------------------------------------------------------------------

/// What a method sees while it resolves its settings: each section is `params.<section>`
/// merged with the method's own overrides, deserialised and checked; problems are placed at the
/// method's override when it set the value, else at `params`.
pub struct Resolver<'p, 'a> {
    problems: &'p mut Problems<'a>,
    params: &'p BTreeMap<String, Value>,
    /// Sections whose `params` value was already found broken (reported once there).
    broken: &'p BTreeSet<String>,
    method: &'p str,
    overrides: &'p BTreeMap<String, Value>,
}

impl Resolver<'_, '_> {
    /// The method's settings of section `name`, checked; `None` after reporting problems.
    pub fn section<T: DeserializeOwned + Check>(&mut self, name: &str) -> Option<T> {
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

// ---- loading --------------------------------------------------------------------------------

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
fn has_merge_keys(v: &Value) -> bool {
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
fn take_sharing(
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

fn stage_section<T: DeserializeOwned + Check + Default>(
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

fn validate(src: SpecSource, file: SpecFile, placed: Vec<(Vec<String>, String)>) -> Result<Spec> {
    let mut p = Problems {
        at: Locator {
            display: &src.display,
            text: &src.text,
            overrides: placed,
        },
        list: vec![],
    };
    // The name is a folder of the store's `refs/`: no `.`/`..`, no hidden folder, and short
    // enough for any file system.
    if file.name.is_empty()
        || file.name.starts_with('.')
        || file.name.len() > MAX_SPEC_NAME
        || !file
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        p.add(
            &["name"],
            format!(
                "spec `name: {}` must be 1 to {MAX_SPEC_NAME} letters, digits, `-`, `_` or `.`, not starting with `.`",
                file.name
            ),
            None,
        );
    }
    // Names are parts of node ids, table headers and selectors: never empty or blank.
    let named: [(&str, Vec<&String>); 4] = [
        ("datasets", file.datasets.keys().collect()),
        ("supervision", file.supervision.keys().collect()),
        ("methods", file.methods.keys().collect()),
        ("targets", file.targets.keys().collect()),
    ];
    for (section, names) in named {
        for name in names.into_iter().filter(|n| n.trim().is_empty()) {
            p.add(
                &[section, name.as_str()],
                format!(
                    "`{section}` has an entry named `{name}`; a name must not be empty or blank"
                ),
                Some("name it with letters, digits, `-` or `_`".into()),
            );
        }
    }
    // Datasets.
    for (name, d) in &file.datasets {
        let at = |field: &'static str| ["datasets", name.as_str(), field];
        let roles: BTreeSet<&str> = d
            .files
            .keys()
            .chain(d.fetch.keys())
            .map(|s| s.as_str())
            .collect();
        for (role, f) in &d.fetch {
            let at =
                |field: &'static str| ["datasets", name.as_str(), "fetch", role.as_str(), field];
            let check_one =
                |p: &mut Problems,
                 place: &str,
                 url: &str,
                 digests: [(&'static str, &Option<String>); 3]| {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        p.add(&at("url"), format!("dataset `{name}`: `{place}.url` must be an http:// or https:// URL, got `{url}`"), None);
                    }
                    let given: Vec<&str> = digests
                        .iter()
                        .filter(|(_, v)| v.is_some())
                        .map(|(f, _)| *f)
                        .collect();
                    if given.len() > 1 {
                        p.add(
                            &at(given[1]),
                            format!(
                                "dataset `{name}`: `{place}` gives {} digests",
                                given.join(" and ")
                            ),
                            Some("give one digest per file".into()),
                        );
                    }
                    for (field, v) in digests {
                        if let Some(v) = v {
                            let len = if field == "git_blob" { 40 } else { 64 };
                            if v.len() != len || !v.chars().all(|c| c.is_ascii_hexdigit()) {
                                p.add(&at(field), format!("dataset `{name}`: `{place}.{field}` must be {len} hex digits, got `{v}`"), None);
                            }
                        }
                    }
                };
            let place = format!("fetch.{role}");
            match (&f.url, f.parts.is_empty()) {
                (Some(url), true) => check_one(
                    &mut p,
                    &place,
                    url,
                    [("sha256", &f.sha256), ("blake3", &f.blake3), ("git_blob", &f.git_blob)],
                ),
                (None, false) => {
                    if f.sha256.is_some() || f.blake3.is_some() || f.git_blob.is_some() {
                        p.add(&at("parts"), format!("dataset `{name}`: `{place}` gives a digest beside `parts`"), Some("each part carries its own digest".into()));
                    }
                    for (k, part) in f.parts.iter().enumerate() {
                        check_one(
                            &mut p,
                            &format!("{place}.parts[{k}]"),
                            &part.url,
                            [("sha256", &part.sha256), ("blake3", &part.blake3), ("git_blob", &part.git_blob)],
                        );
                    }
                    if d.files.contains_key(role) {
                        p.add(&["datasets", name, "files", role], format!("dataset `{name}`: `files.{role}` names a local copy of a file fetched in parts"), Some("drop it; put the downloaded parts into $UPCC_DATA_MIRROR instead (found by their file names)".into()));
                    }
                }
                (Some(_), false) => p.add(&at("parts"), format!("dataset `{name}`: `{place}` gives both `url` and `parts`"), Some("one file has a `url`; a file published in pieces has `parts`, each with its `url`".into())),
                (None, true) => p.add(&at("url"), format!("dataset `{name}`: `{place}` has no `url`"), Some("give `url` and a digest (`sha256`, `blake3` or `git_blob`), or `parts`".into())),
            }
        }
        let (single, split) = d.format.roles();
        let ok =
            roles == single.iter().copied().collect() || roles == split.iter().copied().collect();
        if !ok {
            p.add(
                &at("files"),
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
                        &["datasets", name, "files", role],
                        format!("dataset `{name}`: no embedded dataset `{e}`"),
                        Some("embedded datasets: mnist5k".into()),
                    );
                }
            } else if !src.dir.join(path).exists() && !d.fetch.contains_key(role) {
                p.add(
                    &["datasets", name, "files", role],
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
                    &at("split"),
                    format!(
                        "dataset `{name}`: `split: official` needs separate train and test files"
                    ),
                    None,
                );
            }
            if s.kind == SplitKind::Stratified && !(s.test_fraction > 0.0 && s.test_fraction < 1.0)
            {
                p.add(
                    &["datasets", name, "split", "test_fraction"],
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
                &at("embedding_dim"),
                format!("dataset `{name}`: `embedding_dim` must be at least 1"),
                None,
            );
        }
        if d.embedding_dim > MAX_EMBEDDING_DIM {
            p.add(
                &at("embedding_dim"),
                format!(
                    "dataset `{name}`: `embedding_dim: {}` is not an embedding to cluster (at most {MAX_EMBEDDING_DIM}; the paper uses 10, and 20 for CIFAR100-20)",
                    d.embedding_dim
                ),
                None,
            );
        }
        if let Some(c) = d.n_classes.filter(|&c| c == 0 || c > MAX_CLASSES) {
            p.add(
                &at("n_classes"),
                format!(
                    "dataset `{name}`: `n_classes: {c}` must be 1 to {MAX_CLASSES} (the paper's datasets have 10 or 20)"
                ),
                Some("leave it out to take the classes from the labels".into()),
            );
        }
        if let Scaling::Multiply(f) = d.scaling {
            if !f.is_finite() {
                p.add(
                    &at("scaling"),
                    format!("dataset `{name}`: the scaling factor must be finite"),
                    None,
                );
            }
        }
    }
    // Supervision.
    for (name, s) in &file.supervision {
        let at = |field: &'static str| ["supervision", name.as_str(), field];
        match s {
            SupervisionSpec::Single { level } => {
                if !(*level > 0.0 && *level <= 1.0) {
                    p.add(
                        &at("level"),
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
                        &at("experts"),
                        format!("supervision `{name}`: `experts` must be at least 1"),
                        None,
                    );
                }
                if *experts > 10_000 {
                    p.add(
                        &at("experts"),
                        format!("supervision `{name}`: {experts} experts is not a supervision setting (at most 10000)"),
                        None,
                    );
                }
                for (f, v) in [("familiar", familiar), ("unfamiliar", unfamiliar)] {
                    if !(*v > 0.0 && *v <= 1.0) {
                        p.add(
                            &at(f),
                            format!("supervision `{name}`: `{f}` must be in (0, 1], got {v}"),
                            None,
                        );
                    }
                }
            }
            SupervisionSpec::Oracle { experts } => {
                if !(1..=10_000).contains(experts) {
                    p.add(
                        &at("experts"),
                        format!("supervision `{name}`: `experts` (nominal expert ids of the oracle judgments) must be in 1..=10000, got {experts}"),
                        None,
                    );
                }
            }
            SupervisionSpec::File { path } => {
                if !src.dir.join(path).exists() {
                    p.add(
                        &at("path"),
                        format!("supervision `{name}`: constraints file `{path}` not found"),
                        Some(format!(
                            "paths are relative to the spec's folder `{}`",
                            src.dir.display()
                        )),
                    );
                }
            }
        }
    }
    // Trials: a count or a list of seeds.
    let trials: Vec<u64> = match &file.trials {
        Value::Number(n) if n.as_u64().is_some() => {
            let n = n.as_u64().expect("checked");
            if n as u128 > MAX_NODES {
                p.add(
                    &["trials"],
                    format!("`trials: {n}` is far more trials than an experiment runs"),
                    Some("`trials: 5` (seeds 1..5) or `trials: [1, 2, 3]`".into()),
                );
                vec![1]
            } else {
                (1..=n).collect()
            }
        }
        Value::Sequence(s) if s.iter().all(|v| v.as_u64().is_some()) => {
            s.iter().map(|v| v.as_u64().expect("checked")).collect()
        }
        other => {
            let shown = serde_yaml_ng::to_string(other)
                .unwrap_or_default()
                .trim()
                .to_string();
            p.add(
                &["trials"],
                format!("`trials` must be a number of trials or a list of seeds (whole numbers ≥ 0), got `{shown}`"),
                Some("`trials: 5` (seeds 1..5) or `trials: [1, 2, 3]`".into()),
            );
            vec![1]
        }
    };
    if trials.is_empty() {
        p.add(
            &["trials"],
            "`trials` must name at least one trial",
            Some("`trials: 5` (seeds 1..5) or `trials: [1, 2, 3]`".into()),
        );
    }
    if trials.iter().collect::<BTreeSet<_>>().len() != trials.len() {
        p.add(&["trials"], "`trials` lists a seed twice", None);
    }
    // Parameter sections: known names, then the stages' own, checked.
    let known = sections();
    for name in file.params.keys() {
        if !known.contains(&name.as_str()) {
            p.unknown(&["params", name], "parameter section", name, &known);
        }
    }
    let mut broken = BTreeSet::new();
    let mut sections = file.params.clone();
    // The paper trains one expert (group) per dataset and setting (App. C.3: "one expert
    // classifier is trained per dataset"); trials draw their own constraints from it.
    let expert_sharing = take_sharing(
        &mut p,
        &mut sections,
        "expert",
        Sharing {
            seed: 0,
            per_trial: false,
        },
    );
    let pretrain_sharing = take_sharing(
        &mut p,
        &mut sections,
        "pretrain",
        Sharing {
            seed: 0,
            per_trial: false,
        },
    );
    let expert: ClassifierParams = stage_section(&mut p, &sections, "expert", &mut broken);
    let constraints: ConstraintSettings =
        stage_section(&mut p, &file.params, "constraints", &mut broken);
    let cluster: ClusterSettings = stage_section(&mut p, &file.params, "cluster", &mut broken);
    let table: TableSettings = stage_section(&mut p, &file.params, "table", &mut broken);
    let pretrain = PretrainSpec {
        settings: stage_section(&mut p, &sections, "pretrain", &mut broken),
        sharing: pretrain_sharing,
    };
    // Sections only methods read: structure checked here once, so that a broken base section
    // is reported at `params` and not once per method.
    for name in method::method_sections() {
        if let Some(v) = file.params.get(name).filter(|v| !v.is_null()) {
            if !v.is_mapping() {
                broken.insert(name.to_string());
                p.add(
                    &["params", name],
                    format!("`params.{name}` must be a mapping of settings"),
                    None,
                );
            }
        }
    }
    // Methods.
    let kinds = method::kinds();
    let mut methods = BTreeMap::new();
    for (name, mv) in &file.methods {
        let mapping = match mv {
            Value::Null => Default::default(),
            Value::Mapping(m) => m.clone(),
            _ => {
                p.add(
                    &["methods", name],
                    format!("method `{name}` must be a mapping (`{{}}` for the defaults)"),
                    None,
                );
                continue;
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
                continue;
            }
            None => name.clone(),
        };
        let Some(m) = method::lookup(&kind_name) else {
            let explicit = mapping.contains_key("kind");
            p.add(
                &if explicit { vec!["methods", name.as_str(), "kind"] } else { vec!["methods", name.as_str()] },
                if explicit {
                    format!("method `{name}`: unknown kind `{kind_name}`")
                } else {
                    format!("method `{name}` is not a known method and sets no `kind`")
                },
                Some(format!(
                    "{}known methods: {} (a method of another name needs `kind: probpair` or similar)",
                    nearest(&kind_name, kinds.iter().copied()).map(|n| format!("did you mean `{n}`? ")).unwrap_or_default(),
                    kinds.join(", ")
                )),
            );
            continue;
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
            continue;
        }
        let mut cx = Resolver {
            problems: &mut p,
            params: &file.params,
            broken: &broken,
            method: name,
            overrides: &own,
        };
        if let Some(settings) = m.resolve(&mut cx) {
            methods.insert(
                name.clone(),
                ResolvedMethod {
                    method: m,
                    settings,
                },
            );
        }
    }
    if let Some(ex) = &file.executor {
        if let Some(k) = ex
            .kind
            .as_deref()
            .filter(|k| !["local", "slurm"].contains(k))
        {
            p.add(
                &["executor", "kind"],
                format!("unknown executor `{k}`"),
                Some("`local` or `slurm`".into()),
            );
        }
        for (field, msg) in ex.slurm.check() {
            p.add(
                &["executor", "slurm", field.as_str()],
                format!("`executor.slurm.{field}` {msg}"),
                None,
            );
        }
    }
    // Targets.
    if file.targets.is_empty() {
        p.add(
            &["targets"],
            "the spec declares no targets",
            Some("add `targets: {main: {grid: {...}}}`".into()),
        );
    }
    let (ds, sv, me) = (
        names_of(&file.datasets),
        names_of(&file.supervision),
        file.methods.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
    );
    let mut node_estimate: u128 = 0;
    for (t, target) in &file.targets {
        let at = |field: &'static str| ["targets", t.as_str(), "grid", field];
        let g = &target.grid;
        let experts = target.kind.per_setting();
        let kind = target.kind.name();
        if experts && !g.method.is_empty() {
            p.add(&at("method"), format!("target `{t}` (kind: {kind}) is indexed by dataset and supervision only; remove `grid.method`"), None);
        }
        if experts
            && (g.pretrain.is_some()
                || (target.kind != TargetKind::ConstraintValues
                    && (g.corruption.is_some() || g.budget.is_some())))
        {
            p.add(&at("dataset"), format!("target `{t}` (kind: {kind}) is indexed by dataset and supervision{}; remove the other axes from its grid", if target.kind == TargetKind::ConstraintValues { " (and corruption, budget)" } else { " only" }), None);
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
                p.add(
                    &at(axis),
                    format!("target `{t}`: `grid.{axis}` is empty"),
                    None,
                );
            }
            for v in values {
                if !valid.contains(&v.as_str()) {
                    p.unknown(&at(axis), what, v, valid);
                }
            }
        }
        if let Some(cs) = &g.corruption {
            for c in cs {
                if !(0.0..=1.0).contains(c) {
                    p.add(
                        &at("corruption"),
                        format!("target `{t}`: corruption {c} is outside [0, 1]"),
                        None,
                    );
                }
            }
        }
        if let Some(bs) = &g.budget {
            if bs.contains(&0) {
                p.add(
                    &at("budget"),
                    format!("target `{t}`: a budget of 0 constraints"),
                    None,
                );
            }
        }
        for m in &g.method {
            let Some(r) = methods.get(m) else { continue };
            if target.kind == TargetKind::Selection && !r.method.needs_validation(&r.settings) {
                p.add(&at("method"), format!("target `{t}` (kind: selection) shows what a hyperparameter search chose; method `{m}` ({}) searches none with these settings", r.method.kind()), Some("list methods with a search (volmax-dcc, sp-ea, wpp-ea, without a fixed `volmax.lambda` / `ensemble.alpha`)".into()));
            }
            if target.kind == TargetKind::Figure && !r.method.records_diagnostics() {
                p.add(&at("method"), format!("target `{t}` (kind: figure) draws ECI-PP's held-out diagnostics; method `{m}` ({}) records none", r.method.kind()), None);
            }
            if r.method.needs_multi_expert() {
                for sup in &g.supervision {
                    if !file
                        .supervision
                        .get(sup)
                        .is_some_and(SupervisionSpec::is_multi_expert)
                    {
                        p.add(&at("supervision"), format!("target `{t}`: method `{m}` ({}) has one member per expert and needs a multi-expert supervision setting; `{sup}` is not one", r.method.kind()), None);
                    }
                }
            }
            if r.method.needs_validation(&r.settings) {
                for ds_name in &g.dataset {
                    if file
                        .datasets
                        .get(ds_name)
                        .is_some_and(|d| d.validation == 0)
                    {
                        p.add(
                            &["datasets", ds_name, "validation"],
                            format!("method `{m}` ({}) selects its hyperparameter by validation ACC, but dataset `{ds_name}` reserves no validation rows", r.method.kind()),
                            Some("set `validation: N` on the dataset (the paper reserves 1000), or fix the hyperparameter (`volmax.lambda`, `ensemble.alpha`)".into()),
                        );
                    }
                }
            }
            if g.pretrain.as_ref().is_some_and(|v| v.contains(&true)) && !r.method.pretrainable() {
                p.add(&at("pretrain"), format!("target `{t}`: method `{m}` ({}) has no pretraining; use `pretrain: [false]` for it, a separate target, or leave `pretrain` out of the grid (each method then runs as in the paper's main table)", r.method.kind()), None);
            }
        }
        for sup in &g.supervision {
            let from_file = matches!(
                file.supervision.get(sup),
                Some(SupervisionSpec::File { .. })
            );
            if experts && from_file && target.kind != TargetKind::ConstraintValues {
                p.add(&at("supervision"), format!("target `{t}` (kind: {kind}): supervision `{sup}` comes from a file and has no experts"), None);
            }
            if experts
                && target.kind != TargetKind::ConstraintValues
                && matches!(
                    file.supervision.get(sup),
                    Some(SupervisionSpec::Oracle { .. })
                )
            {
                p.add(&at("supervision"), format!("target `{t}` (kind: {kind}): supervision `{sup}` is the oracle's and has no trained experts"), None);
            }
            if target.kind == TargetKind::Figure && from_file {
                p.add(&at("supervision"), format!("target `{t}` (kind: figure): supervision `{sup}` comes from a file, which has no held-out diagnostic set (it needs the experts' judgments and the oracle labels)"), Some("draw the figure for an expert supervision setting".into()));
            }
            if from_file && (g.corruption.is_some() || g.budget.is_some()) {
                p.add(&at("supervision"), format!("target `{t}`: supervision `{sup}` comes from a file, so it cannot vary `corruption` or `budget`"), None);
            }
        }
        if target.kind == TargetKind::Figure && constraints.diagnostic_pairs == 0 {
            p.add(
                &["params", "constraints", "diagnostic_pairs"],
                format!("`params.constraints.diagnostic_pairs` is 0, but target `{t}` (kind: figure) draws the held-out diagnostics of those pairs"),
                Some("use at least 1 (the paper: 1000)".into()),
            );
        }
        let axes = axes_of(target);
        if target.kind == TargetKind::Sweep {
            match target.x.as_deref() {
                None => p.add(
                    &["targets", t.as_str(), "x"],
                    format!("target `{t}` (kind: sweep) needs `x`: the grid axis along the x axis"),
                    Some(format!("one of: {}", axes.join(", "))),
                ),
                Some(x) if !axes.contains(&x) => p.add(
                    &["targets", t.as_str(), "x"],
                    format!("target `{t}`: `x: {x}` is not an axis of its grid"),
                    Some(format!("one of: {}", axes.join(", "))),
                ),
                Some(_) => {}
            }
            if let Some(x) = target.x.as_deref() {
                let values: Vec<String> = match x {
                    "dataset" => g.dataset.clone(),
                    "supervision" => g.supervision.clone(),
                    "method" => g.method.clone(),
                    "corruption" => g
                        .corruption
                        .iter()
                        .flatten()
                        .map(|c| crate::wiring::fmt_f(*c))
                        .collect(),
                    "budget" => g.budget.iter().flatten().map(|b| b.to_string()).collect(),
                    _ => g.pretrain.iter().flatten().map(|b| b.to_string()).collect(),
                };
                for k in target.x_labels.keys() {
                    if !values.contains(k) {
                        p.add(
                            &["targets", t.as_str(), "x_labels", k.as_str()],
                            format!("target `{t}`: `x_labels` names `{k}`, which is not a value of `x: {x}`"),
                            Some(format!("values: {}", values.join(", "))),
                        );
                    }
                }
            }
            let lines = target.lines.as_deref().unwrap_or("method");
            if lines != "none" && !axes.contains(&lines) {
                p.add(
                    &["targets", t.as_str(), "lines"],
                    format!("target `{t}`: `lines: {lines}` is not an axis of its grid"),
                    Some(format!("one of: {}, or `none`", axes.join(", "))),
                );
            } else if target.x.as_deref() == Some(lines) {
                p.add(
                    &["targets", t.as_str(), "lines"],
                    format!("target `{t}`: `lines` and `x` are both `{lines}`"),
                    Some("draw one line per value of another axis (default `method`), or `lines: none`".into()),
                );
            }
        } else {
            let labelled = (!target.x_labels.is_empty()).then_some(());
            for (field, set) in [
                ("x", target.x.as_ref().map(|_| ())),
                ("lines", target.lines.as_ref().map(|_| ())),
                ("x_labels", labelled),
                ("x_title", target.x_title.as_ref().map(|_| ())),
            ] {
                if set.is_some() {
                    p.add(
                        &["targets", t.as_str(), field],
                        format!("target `{t}`: `{field}` places a sweep figure's axes; this target is of kind `{}`", target.kind.name()),
                        Some("drop it, or make the target `kind: sweep`".into()),
                    );
                }
            }
        }
        for col in &target.columns() {
            if !axes.contains(&col.as_str()) {
                let hint = if col == "pretrain" {
                    Some("pretraining is an axis only when the grid lists it: add `pretrain: [true, false]` (or the values you want) to the grid".to_string())
                } else {
                    nearest(col, axes.iter().copied())
                        .map(|n| format!("did you mean `{n}`? (axes: {})", axes.join(", ")))
                };
                p.add(
                    &["targets", t, "columns"],
                    format!("target `{t}`: column `{col}` is not an axis of its grid"),
                    hint.or_else(|| Some(format!("axes: {}", axes.join(", ")))),
                );
            }
        }
        for s in &target.splits {
            if s != "train" && s != "test" && s != "val" {
                p.add(
                    &["targets", t, "splits"],
                    format!("target `{t}`: split `{s}` must be `train`, `test` or `val`"),
                    None,
                );
            }
        }
        if g.pretrain.as_ref().is_some_and(|v| v.is_empty()) {
            p.add(
                &at("pretrain"),
                format!("target `{t}`: `grid.pretrain` is empty"),
                None,
            );
        }
        let cells = (g.dataset.len() as u128)
            .saturating_mul(g.supervision.len().max(1) as u128)
            .saturating_mul(g.method.len().max(1) as u128)
            .saturating_mul(g.pretrain.as_ref().map_or(1, |v| v.len()).max(1) as u128)
            .saturating_mul(g.corruption.as_ref().map_or(1, |c| c.len()).max(1) as u128)
            .saturating_mul(g.budget.as_ref().map_or(1, |b| b.len()).max(1) as u128);
        node_estimate =
            node_estimate.saturating_add(cells.saturating_mul(trials.len() as u128 * 6));
    }
    if node_estimate > MAX_NODES {
        p.add(
            &["trials"],
            format!("the targets would make about {node_estimate} nodes (cells × trials), more than any experiment; lower `trials` or the grids"),
            None,
        );
    }
    // Figures draw panels G and H from a run on oracle judgments unless told otherwise.
    let mut oracle_runs = BTreeMap::new();
    for (t, target) in &file.targets {
        if target.kind != TargetKind::Figure {
            if target.oracle_panels.is_some() {
                p.add(
                    &["targets", t, "oracle_panels"],
                    format!("target `{t}`: `oracle_panels` chooses where a figure's panels G and H come from; this target is of kind `{}`", target.kind.name()),
                    Some("drop it, or make the target `kind: figure`".into()),
                );
            }
            continue;
        }
        if target.oracle_panels.unwrap_or_default() != OraclePanels::Run {
            continue;
        }
        for sup in &target.grid.supervision {
            let Some(experts) = file
                .supervision
                .get(sup)
                .filter(|s| !matches!(s, SupervisionSpec::Oracle { .. }))
                .and_then(SupervisionSpec::n_experts)
            else {
                continue;
            };
            let name = oracle_run_name(sup);
            if file.supervision.contains_key(&name) {
                p.add(
                    &["supervision", &name],
                    format!("supervision `{name}`: this name is taken by the oracle run that figure target `{t}` derives from `{sup}`"),
                    Some("rename the setting, or set `oracle_panels: relabel` on the figure".into()),
                );
            }
            oracle_runs.insert(name, SupervisionSpec::Oracle { experts });
        }
    }
    // Published values of table targets.
    let mut published = BTreeMap::new();
    for (t, target) in &file.targets {
        let Some(ps) = &target.published else {
            continue;
        };
        let at = |f: &'static str| ["targets", t.as_str(), "published", f];
        if !matches!(
            target.kind,
            TargetKind::Table
                | TargetKind::Experts
                | TargetKind::BlindSpots
                | TargetKind::Selection
                | TargetKind::Runtime
        ) {
            p.add(&at("file"), format!("target `{t}`: `published` values are compared with tables (clustering, experts, blind-spot, selection and runtime tables); this target is of kind `{}`", target.kind.name()), None);
            continue;
        }
        for c in &ps.ignore {
            if !["pretrain", "corruption", "budget"].contains(&c.as_str()) {
                p.add(&at("ignore"), format!("target `{t}`: `published.ignore` lists `{c}`; only `pretrain`, `corruption` and `budget` can be left unmatched"), None);
            }
        }
        let (row_default, col_default) = if target.kind == TargetKind::Runtime {
            ("method", "dataset")
        } else {
            ("dataset", "supervision")
        };
        let row_axis = ps.rows.clone().unwrap_or_else(|| row_default.to_string());
        let column_axis = ps
            .columns
            .clone()
            .unwrap_or_else(|| col_default.to_string());
        for (field, axis) in [("rows", &row_axis), ("columns", &column_axis)] {
            if !["dataset", "supervision", "method"].contains(&axis.as_str()) {
                p.add(&at(field), format!("target `{t}`: `published.{field}` is `{axis}`; the file's rows and columns can be `dataset`, `supervision` or `method`"), None);
            }
        }
        let path = src.dir.join(&ps.file);
        let read = std::fs::read(&path)
            .map_err(|e| format!("cannot read `{}`: {e}", ps.file))
            .and_then(|bytes| {
                if target.kind == TargetKind::Table {
                    upcc_report::published::read_scores(&bytes, &ps.file, &ps.table)
                        .map(|r| (r, vec![]))
                } else {
                    upcc_report::published::read_printed(&bytes, &ps.file, &ps.table)
                        .map(|c| (vec![], c))
                }
            });
        let read = read.and_then(|(rows, printed)| {
            // An experts table's values are accuracies: numbers.
            if target.kind == TargetKind::Experts {
                if let Some(c) = printed
                    .iter()
                    .find(|c| c.text.parse::<f64>().map_or(true, |v| !v.is_finite()))
                {
                    return Err(format!(
                        "`{}`:{}: value `{}` is not a number",
                        ps.file, c.line, c.text
                    ));
                }
            }
            Ok((rows, printed))
        });
        match read {
            Ok((rows, printed)) => {
                published.insert(
                    t.clone(),
                    PublishedTable {
                        source: ps
                            .source
                            .clone()
                            .unwrap_or_else(|| format!("`{}`, table `{}`", ps.file, ps.table)),
                        rows,
                        printed,
                        datasets: ps.datasets.clone(),
                        supervision: ps.supervision.clone(),
                        methods: ps.methods.clone(),
                        ignore: ps.ignore.clone(),
                        row_axis,
                        column_axis,
                        device: ps.device.clone(),
                    },
                );
            }
            Err(e) => p.add(
                &at("file"),
                format!("target `{t}`: {e}"),
                Some(format!(
                    "paths are relative to the spec's folder `{}`",
                    src.dir.display()
                )),
            ),
        }
    }
    let display = src.display.clone();
    p.into_result(&display)?;
    let shapes = file
        .datasets
        .iter()
        .map(|(name, d)| (name.clone(), dataset_shape(d, &src.dir)))
        .collect();
    Ok(Spec {
        display: src.display,
        dir: src.dir,
        file,
        trials,
        params: StageParams {
            expert,
            expert_sharing,
            constraints,
            pretrain,
            cluster,
            table,
        },
        methods,
        target_order: vec![],
        oracle_runs,
        published,
        shapes,
    })
}

fn names_of<T>(m: &BTreeMap<String, T>) -> Vec<&str> {
    m.keys().map(|k| k.as_str()).collect()
}

/// The axes of a target's grid, in display order.
pub fn axes_of(target: &TargetSpec) -> Vec<&'static str> {
    let g = &target.grid;
    let mut a = vec!["dataset", "supervision"];
    if target.kind.per_setting() {
        if target.kind == TargetKind::ConstraintValues {
            a.extend(g.corruption.iter().map(|_| "corruption"));
            a.extend(g.budget.iter().map(|_| "budget"));
        }
        return a;
    }
    if g.corruption.is_some() {
        a.push("corruption");
    }
    if g.budget.is_some() {
        a.push("budget");
    }
    a.push("method");
    if g.pretrain.is_some() {
        a.push("pretrain");
    }
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
        let (m, _) = explain_serde(
            "params.train.epochs: invalid type: integer `99999999999999999999999` as u128, expected any YAML value",
        );
        assert!(m.contains("far too large") && !m.contains("u128"), "{m}");
        let (m, _) = explain_serde("invalid type: string \"two\", expected usize");
        assert!(m.ends_with("expected a whole number ≥ 0"), "{m}");
    }

    #[test]
    fn locate_finds_whole_words_only() {
        let text = "a: probpair\nb: [probpar, x]\n";
        assert_eq!(locate(text, "probpar"), Some(2));
        assert_eq!(locate(text, "probpair"), Some(1));
    }

    #[test]
    fn locate_path_follows_indentation_and_flow_mappings() {
        let text = "\
name: x
params:
  train:
    epochs: 3
    lr: 0.1
  constraints: {budget: 300, corruption: 0.3}
methods:
  eci-pp: {train: {epochs: 8}, eci: {warmup_epochs: 2}}
  probpair:
    train:
      epochs: 4
";
        assert_eq!(locate_path(text, &["params", "train", "lr"]), Some(5));
        assert_eq!(locate_path(text, &["params", "train", "epochs"]), Some(4));
        assert_eq!(
            locate_path(text, &["params", "constraints", "corruption"]),
            Some(6)
        );
        assert_eq!(
            locate_path(text, &["methods", "eci-pp", "eci", "warmup_epochs"]),
            Some(8)
        );
        assert_eq!(
            locate_path(text, &["methods", "probpair", "train", "epochs"]),
            Some(11)
        );
        // A missing leaf places the problem at the deepest key present.
        assert_eq!(
            locate_path(text, &["params", "train", "batch_size"]),
            Some(3)
        );
    }

    #[test]
    fn overrides_create_and_replace_nested_keys() {
        let mut v: Value =
            serde_yaml_ng::from_str("params:\n  constraints:\n    corruption: 0.3\n").unwrap();
        let placed = apply_overrides(
            &mut v,
            &["constraints.corruption=0.5".into(), "train.epochs=3".into()],
        )
        .unwrap();
        assert_eq!(v["params"]["constraints"]["corruption"].as_f64(), Some(0.5));
        assert_eq!(v["params"]["train"]["epochs"].as_u64(), Some(3));
        assert_eq!(placed[0].0, ["params", "constraints", "corruption"]);
        assert!(apply_overrides(&mut v, &["nonsense".into()]).is_err());
        let mut w: Value =
            serde_yaml_ng::from_str("supervision:\n  lv0.01: {kind: single, level: 0.01}\n")
                .unwrap();
        let placed = apply_overrides(&mut w, &["supervision.lv0.01.level=0.1".into()]).unwrap();
        assert_eq!(w["supervision"]["lv0.01"]["level"].as_f64(), Some(0.1));
        assert_eq!(placed[0].0, ["supervision", "lv0.01", "level"]);
    }

    #[test]
    fn embedded_smoke_spec_loads() {
        let s = load("smoke", &[]).unwrap();
        assert_eq!(s.file.name, "smoke");
        assert!(!s.trials.is_empty());
        assert_eq!(
            s.target_order,
            [
                "main",
                "eci",
                "experts",
                "diagnostics",
                "sweep",
                "blind-spots",
                "constraint-values",
                "runtime"
            ]
        );
    }
}
