//! The schema of a spec file: what its YAML deserialises into, before any name is resolved
//! or any value checked (`validate.rs` does both). A leaf: it names the stages' settings
//! types and nothing else of the model.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::Value;
use upcc_report::{Metric, TableSettings};
use upcc_stages::cluster::ClusterSettings;
use upcc_stages::constraints::ConstraintSettings;
use upcc_stages::expert::ClassifierParams;
use upcc_stages::features::{DataFormat, HeaderMode, Scaling, Split};
use upcc_stages::pretrain::PretrainSettings;

use super::executor::ExecutorSection;

/// The `kind:` a target has when its spec names none.
pub const DEFAULT_TARGET_KIND: &str = "table";

fn default_target_kind() -> String {
    DEFAULT_TARGET_KIND.to_string()
}

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
    pub executor: Option<ExecutorSection>,
    /// The remote cache its runs consult and fill (`s3://…`, `gs://…`, `az://…`, `file:///…`,
    /// or `off`); `--remote` and `$UPCC_REMOTE` win. Never part of any key.
    #[serde(default)]
    pub remote: Option<String>,
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

/// The fields every target kind reads; a kind's own fields come after them (`own`).
pub const COMMON_TARGET_FIELDS: [&str; 7] = [
    "kind",
    "title",
    "grid",
    "columns",
    "metrics",
    "splits",
    "published",
];

#[derive(Debug, Deserialize)]
pub struct TargetSpec {
    /// The target's kind by name (`table`, `figure`, ...): validation looks it up among the
    /// kinds upcc implements (`targets::REGISTRY`).
    #[serde(default = "default_target_kind")]
    pub kind: String,
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
    /// Tables only: published values to show reproduced − published against.
    #[serde(default)]
    pub published: Option<PublishedSpec>,
    /// Every other field: those only its kind reads (a sweep's `x`, a figure's
    /// `oracle_panels`, ...), which the kind deserialises and checks itself; validation refuses
    /// the rest by name.
    #[serde(flatten)]
    pub own: BTreeMap<String, Value>,
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
