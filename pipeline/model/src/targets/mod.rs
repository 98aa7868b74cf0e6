//! The target kinds, one file each: what cells a kind reads, what it checks in its section,
//! the node it adds over its cells (a table or a figure, with the task that renders it), and
//! how it is shown. Adding a kind is one file here, registered in [`REGISTRY`]; the spec
//! names it as `kind:` and everything else (validation, the DAG, `run`'s and `report`'s
//! output) asks the kind.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use upcc_engine::InputDef;
use upcc_report::published::Comparison;
use upcc_report::TableLayout;

use crate::error::Result;
use crate::method::ResolvedMethod;
use crate::specs::axis::Axis;
use crate::specs::schema::COMMON_TARGET_FIELDS;
use crate::specs::schema::{SpecFile, SupervisionSpec, TargetSpec};
use crate::specs::source::Problems;
use crate::wiring::{Cell, NodeSpec, Numerics, Wiring};

pub mod blind_spots;
pub mod cells;
pub mod constraint_values;
pub mod experts;
pub mod figure;
pub mod published;
pub mod runtime;
pub mod selection;
pub mod sweep;
pub mod table;

pub use cells::CellsCx;
pub use published::PublishedTable;
pub use table::{TableInput, TableSource};

/// Version of the table stage (rendering lives in `upcc-report`).
/// 2: `table.parquet` holds float64 means and std, typed axis columns.
pub const TABLE_VERSION: u32 = 2;
/// Version of the figure stage (drawing lives in `upcc-report`).
pub const FIGURE_VERSION: u32 = 1;

/// A cell × trial of a target and the node whose output the target reads (metrics for
/// tables, the expert node for expert tables, the training node for figures).
#[derive(Clone, Debug)]
pub struct CellTrial {
    /// Its coordinates on the target's axes (axis name → value).
    pub coords: BTreeMap<String, String>,
    /// Where it lies on every axis (those the grid does not vary at the spec's setting).
    pub point: Point,
    pub trial: u64,
    pub leaf: usize,
    pub output: &'static str,
    /// Figures: the training node of the same cell under oracle judgments (panels G, H).
    pub oracle_leaf: Option<usize>,
}

impl CellTrial {
    /// Cell `cell` of a target on `axes`, read from output `output` of node `leaf`.
    pub fn new(
        cell: &Cell<'_>,
        axes: &[Axis],
        leaf: usize,
        output: &'static str,
        oracle_leaf: Option<usize>,
    ) -> CellTrial {
        CellTrial {
            coords: cell.coords(axes),
            point: Point {
                dataset: cell.dataset.to_string(),
                supervision: cell.supervision.to_string(),
                method: cell.method.to_string(),
                pretrain: cell.pretrain,
                corruption: cell.corruption,
                budget: cell.budget,
            },
            trial: cell.seed,
            leaf,
            output,
            oracle_leaf,
        }
    }
}

/// Where a cell lies on every axis (a method-less cell's method is empty).
#[derive(Clone, Debug)]
pub struct Point {
    pub dataset: String,
    pub supervision: String,
    pub method: String,
    pub pretrain: bool,
    pub corruption: f64,
    pub budget: usize,
}

/// A target as built (by `graph.rs`): its table or figure node and its cells.
#[derive(Clone, Debug)]
pub struct TargetNodes {
    pub name: String,
    pub kind: TargetKind,
    /// The table or figure node.
    pub node: usize,
    pub layout: TableLayout,
    pub cells: Vec<CellTrial>,
    pub inputs: Vec<TableInput>,
    /// Results per cell when complete (trials; 1 for selections and shared experts).
    pub trials: usize,
}

/// Which results a target's cells read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cells {
    /// One cell per dataset × supervision (× corruption × budget when the grid varies them):
    /// the first trial's constraint records.
    ConstraintRecords,
    /// One cell per dataset × supervision: its experts, under every expert seed, or only the
    /// first (`first_seed_only`).
    Experts { first_seed_only: bool },
    /// One per method cell, no trials: the node of the cell's hyperparameter search.
    Selections,
    /// Every method cell × trial: its metrics, or with `diagnostics` its training node's
    /// held-out diagnostics (and panels G and H from the same cell on oracle judgments).
    Runs { diagnostics: bool },
}

impl Cells {
    /// Indexed by dataset and supervision only (no methods train for it).
    pub fn per_setting(self) -> bool {
        matches!(self, Cells::ConstraintRecords | Cells::Experts { .. })
    }

    /// Results per cell when complete: `trials` for runs, `expert_trials` (the experts'
    /// seeds: one when the trials share them) for experts, one otherwise.
    pub fn trials(self, trials: usize, expert_trials: usize) -> usize {
        match self {
            Cells::ConstraintRecords | Cells::Selections => 1,
            Cells::Experts {
                first_seed_only: true,
            } => 1,
            Cells::Experts {
                first_seed_only: false,
            } => expert_trials,
            Cells::Runs { .. } => trials,
        }
    }
}

/// How a target is shown (by `run`, `report`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The table its node rendered.
    Table,
    /// The figure its node drew (PNG, SVG and the plotted values).
    Figure,
    /// A table composed when shown from the manifests' recorded times (wall time is
    /// provenance, not content): see [`runtime`].
    Runtime,
}

/// How a target's `published:` values are read and compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishedAs {
    /// Clustering scores per cell, from the file's `value` column: reproduced − published.
    Scores,
    /// Printed values that must be numbers, compared as scores (the experts' accuracies).
    PrintedScores,
    /// Printed texts per cell, compared as `Comparison` says.
    Printed(Comparison),
}

/// What a target kind checks its section against.
pub struct CheckCx<'a> {
    /// The target's name.
    pub name: &'a str,
    pub target: &'a TargetSpec,
    pub kind: TargetKind,
    /// What its kind resolved of the fields only it reads.
    pub own: &'a OwnSettings,
    pub file: &'a SpecFile,
    /// The spec's methods, resolved (those that failed to resolve are absent).
    pub methods: &'a BTreeMap<String, ResolvedMethod>,
    /// `params.constraints.diagnostic_pairs`.
    pub diagnostic_pairs: usize,
    /// The axes of its grid.
    pub axes: &'a [Axis],
}

impl CheckCx<'_> {
    /// The path of a field of the target's grid.
    pub fn grid<'b>(&'b self, field: &'b str) -> [&'b str; 4] {
        ["targets", self.name, "grid", field]
    }

    /// The resolved methods of the grid, with their names.
    pub fn grid_methods(&self) -> impl Iterator<Item = (&String, &ResolvedMethod)> {
        self.target
            .grid
            .method
            .iter()
            .filter_map(|m| self.methods.get(m).map(|r| (m, r)))
    }
}

/// What a target kind builds its node from: its cells' wires and what the renderer needs.
pub struct NodeCx<'a> {
    /// The target's name.
    pub name: &'a str,
    pub target: &'a TargetSpec,
    /// What its kind resolved of the fields only it reads.
    pub own: &'a OwnSettings,
    /// Input `m{i}` of every cell (and `o{i}` of a figure cell's oracle run).
    pub wires: Vec<(String, InputDef)>,
    pub layout: &'a TableLayout,
    pub inputs: &'a [TableInput],
    /// Figures: cell input → the input of its oracle run.
    pub oracle_inputs: BTreeMap<String, String>,
    /// Results per cell when complete.
    pub trials: usize,
    /// The spread's degrees of freedom (`params.table.std_ddof`).
    pub std_ddof: u8,
}

/// A kind of target.
pub trait Target: Sync + Send {
    /// The name a spec gives as `kind:`.
    fn name(&self) -> &'static str;
    /// What it shows, in one line (listings and messages).
    fn summary(&self) -> &'static str;
    /// Which results its cells read.
    fn cells(&self) -> Cells;
    /// Enumerate its cells and wire them (on the shared stages and its grid's methods): by
    /// default as [`Target::cells`] says ([`cells`]).
    fn wire_cells(&self, w: &mut Wiring, cx: &CellsCx<'_>) -> Result<Vec<CellTrial>> {
        self.cells().wire(w, cx)
    }
    /// How it is shown.
    fn view(&self) -> View;
    /// What its table node aggregates (table views).
    fn table_source(&self) -> TableSource {
        TableSource::Metrics
    }
    /// The axes spanning its columns when the spec names none (`None`: `method`, and
    /// `pretrain` when the grid has it).
    fn default_columns(&self) -> Option<&'static [Axis]> {
        None
    }
    /// How its `published:` values are compared (`None`: it takes none).
    fn published(&self) -> Option<PublishedAs> {
        None
    }
    /// The default row and column axes of its published file.
    fn published_axes(&self) -> (Axis, Axis) {
        (Axis::Dataset, Axis::Supervision)
    }
    /// The target fields only this kind reads, with what each does (another kind that sets
    /// one is told so).
    fn own_fields(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// Deserialise and check its own fields (`own`: those of [`Target::own_fields`] the target
    /// sets), as a method resolves its sections; problems go to `p`. Kinds without fields of
    /// their own keep nothing.
    fn resolve_own(
        &self,
        _target: &str,
        _own: &BTreeMap<String, Value>,
        _p: &mut Problems<'_>,
    ) -> Option<OwnSettings> {
        Some(Arc::new(()))
    }
    /// Whether its cells are also run on oracle judgments (a figure's panels G and H).
    fn oracle_runs(&self, _own: &OwnSettings) -> bool {
        false
    }
    /// Check what this kind needs of its section, grid and methods.
    fn check(&self, _cx: &CheckCx<'_>, _p: &mut Problems<'_>) {}
    /// Add its node (`table/NAME` or `figure/NAME`) over its cells.
    fn node(&self, w: &mut Wiring, cx: NodeCx<'_>) -> Result<usize> {
        table_node(w, cx, self.table_source())
    }
}

/// Every target kind upcc implements (the first is the default).
pub static REGISTRY: &[&dyn Target] = &[
    &table::Table,
    &experts::Experts,
    &figure::Figure,
    &selection::Selection,
    &sweep::Sweep,
    &blind_spots::BlindSpots,
    &constraint_values::ConstraintValues,
    &runtime::Runtime,
];

/// The kind of a `kind:` name.
pub fn lookup(name: &str) -> Option<TargetKind> {
    REGISTRY
        .iter()
        .copied()
        .find(|t| t.name() == name)
        .map(TargetKind)
}

/// Every `kind:` name.
pub fn kinds() -> Vec<&'static str> {
    REGISTRY.iter().map(|t| t.name()).collect()
}

/// A target's kind as the spec names it (`kind: blind-spots`; default `table`).
#[derive(Clone, Copy)]
pub struct TargetKind(pub &'static dyn Target);

impl std::ops::Deref for TargetKind {
    type Target = dyn Target;
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl Default for TargetKind {
    fn default() -> Self {
        TargetKind(REGISTRY[0])
    }
}

impl PartialEq for TargetKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl Eq for TargetKind {}

impl fmt::Debug for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

/// What a kind resolved of the fields only it reads (each kind knows its own type).
pub type OwnSettings = Arc<dyn Any + Send + Sync>;

/// The settings of type `T` a kind resolved (each kind downcasts its own).
pub fn own<T: 'static>(s: &OwnSettings) -> &T {
    s.downcast_ref::<T>()
        .expect("a kind reads the settings it resolved")
}

/// A target as validation resolved it: its kind and that kind's own settings.
#[derive(Clone)]
pub struct ResolvedTarget {
    pub kind: TargetKind,
    pub own: OwnSettings,
    /// The values its `published:` section names, as its kind read them.
    pub published: Option<PublishedTable>,
}

/// Deserialise a kind's own fields into `T` (`#[serde(deny_unknown_fields)]`), placing a
/// problem at the field.
pub fn own_fields<T: DeserializeOwned>(
    target: &str,
    own: &BTreeMap<String, Value>,
    p: &mut Problems<'_>,
) -> Option<T> {
    let map = |fields: &mut dyn Iterator<Item = (&String, &Value)>| {
        let m: serde_yaml_ng::Mapping = fields
            .map(|(k, v)| (Value::String(k.clone()), v.clone()))
            .collect();
        serde_yaml_ng::from_value::<T>(Value::Mapping(m))
    };
    match map(&mut own.iter()) {
        Ok(v) => Some(v),
        Err(e) => {
            // Name the field at fault: the first one that fails alone (a value of the wrong
            // shape); a problem of the fields together (one missing) names the target.
            let culprit = own.iter().find_map(|(k, v)| {
                map(&mut std::iter::once((k, v)))
                    .err()
                    .filter(|e| !e.to_string().starts_with("missing field"))
                    .map(|e| (k, e))
            });
            match culprit {
                Some((k, e)) => p.add_serde(&["targets", target, k], &e),
                None => p.add_serde(&["targets", target], &e),
            }
            None
        }
    }
}

/// Resolve a target: its kind by name, then the fields it sets beyond those every kind reads —
/// those its kind owns go to the kind; one another kind owns is named with that kind; any
/// other is unknown, with the nearest field as a hint. Problems go to `p`.
pub fn resolve(t: &str, target: &TargetSpec, p: &mut Problems<'_>) -> Option<ResolvedTarget> {
    let Some(kind) = lookup(&target.kind) else {
        let known = kinds();
        let listed: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
        p.add(
            &["targets", t, "kind"],
            format!(
                "targets.{t}: unknown variant `{}`, expected one of {}",
                target.kind,
                listed.join(", ")
            ),
            crate::error::nearest(&target.kind, known.iter().copied())
                .map(|n| format!("did you mean `{n}`?")),
        );
        return None;
    };
    let mut mine = BTreeMap::new();
    for (field, value) in &target.own {
        if kind.own_fields().iter().any(|(f, _)| f == field) {
            mine.insert(field.clone(), value.clone());
            continue;
        }
        let owner = REGISTRY.iter().find_map(|k| {
            k.own_fields()
                .iter()
                .find(|(f, _)| f == field)
                .map(|(_, what)| (k.name(), *what))
        });
        match owner {
            Some((owner, what)) => p.add(
                &["targets", t, field],
                format!(
                    "target `{t}`: `{field}` {what}; this target is of kind `{}`",
                    kind.name()
                ),
                Some(format!("drop it, or make the target `kind: {owner}`")),
            ),
            None => {
                let valid: Vec<&str> = COMMON_TARGET_FIELDS
                    .iter()
                    .copied()
                    .chain(kind.own_fields().iter().map(|(f, _)| *f))
                    .collect();
                let listed: Vec<String> = valid.iter().map(|f| format!("`{f}`")).collect();
                p.add(
                    &["targets", t, field],
                    format!(
                        "targets.{t}: unknown field `{field}`, expected one of {}",
                        listed.join(", ")
                    ),
                    crate::error::nearest(field, valid.iter().copied())
                        .map(|n| format!("did you mean `{n}`?")),
                );
            }
        }
    }
    let own = kind.resolve_own(t, &mine, p)?;
    Some(ResolvedTarget {
        kind,
        own,
        published: None,
    })
}

impl TargetKind {
    /// The axes spanning a target's columns: the spec's, else the kind's default, else
    /// `method` (and `pretrain` when the grid has it).
    pub fn columns(&self, target: &TargetSpec) -> Vec<String> {
        if let Some(c) = &target.columns {
            return c.clone();
        }
        let axes: &[Axis] = match self.default_columns() {
            Some(d) => d,
            None if Axis::Pretrain.in_grid(&target.grid) => &[Axis::Method, Axis::Pretrain],
            None => &[Axis::Method],
        };
        axes.iter().map(|a| a.name().to_string()).collect()
    }
}

/// The axes of a target's grid, in display order: dataset and supervision, the optional axes
/// the grid lists (a kind indexed by setting has no method or pretraining axis; one of
/// constraint records no method axis either), then the method.
pub fn axes_of(target: &TargetSpec, kind: TargetKind) -> Vec<Axis> {
    let g = &target.grid;
    let shown = |a: Axis| match a {
        Axis::Dataset | Axis::Supervision => true,
        Axis::Method => !matches!(
            kind.cells(),
            Cells::ConstraintRecords | Cells::Experts { .. }
        ),
        Axis::Pretrain => {
            !matches!(
                kind.cells(),
                Cells::ConstraintRecords | Cells::Experts { .. }
            ) && a.in_grid(g)
        }
        Axis::Corruption | Axis::Budget => {
            !matches!(kind.cells(), Cells::Experts { .. }) && a.in_grid(g)
        }
    };
    Axis::ALL.into_iter().filter(|&a| shown(a)).collect()
}

/// The checks of the kinds indexed by dataset and supervision only: no method axis, no other
/// axes (but corruption and budget where `constraint_axes`), and, where `needs_experts`,
/// supervision settings with trained experts.
pub(crate) fn check_per_setting(
    cx: &CheckCx<'_>,
    p: &mut Problems<'_>,
    constraint_axes: bool,
    needs_experts: bool,
) {
    let (t, kind, g) = (cx.name, cx.kind.name(), &cx.target.grid);
    if !g.method.is_empty() {
        p.add(&cx.grid("method"), format!("target `{t}` (kind: {kind}) is indexed by dataset and supervision only; remove `grid.method`"), None);
    }
    if g.pretrain.is_some() || (!constraint_axes && (g.corruption.is_some() || g.budget.is_some()))
    {
        p.add(&cx.grid("dataset"), format!("target `{t}` (kind: {kind}) is indexed by dataset and supervision{}; remove the other axes from its grid", if constraint_axes { " (and corruption, budget)" } else { " only" }), None);
    }
    if !needs_experts {
        return;
    }
    for sup in &g.supervision {
        match cx.file.supervision.get(sup) {
            Some(SupervisionSpec::File { .. }) => p.add(&cx.grid("supervision"), format!("target `{t}` (kind: {kind}): supervision `{sup}` comes from a file and has no experts"), None),
            Some(SupervisionSpec::Oracle { .. }) => p.add(&cx.grid("supervision"), format!("target `{t}` (kind: {kind}): supervision `{sup}` is the oracle's and has no trained experts"), None),
            _ => {}
        }
    }
}

/// A table target's node (`table/NAME`: the table as Parquet, Markdown, LaTeX and CSV).
pub(crate) fn table_node(w: &mut Wiring, cx: NodeCx<'_>, source: TableSource) -> Result<usize> {
    w.add(NodeSpec {
        id: format!("table/{}", cx.name),
        stage: "table",
        version: TABLE_VERSION,
        numerics: Numerics::Exact,
        inputs: cx.wires,
        outputs: &["table", "markdown", "latex", "csv"],
        labels: BTreeMap::from([
            ("stage".into(), "table".into()),
            ("target".into(), cx.name.to_string()),
        ]),
        resources: Wiring::small(256),
        task: table::TableTask {
            source,
            layout: cx.layout.clone(),
            trials: cx.trials,
            inputs: cx.inputs.to_vec(),
        },
    })
}

/// A figure target's node (`figure/NAME`: PNG, SVG and the plotted values).
pub(crate) fn figure_node<T: upcc_engine::Task + serde::Serialize + 'static>(
    w: &mut Wiring,
    name: &str,
    inputs: Vec<(String, InputDef)>,
    memory_mb: u64,
    task: T,
) -> Result<usize> {
    w.add(NodeSpec {
        id: format!("figure/{name}"),
        stage: "figure",
        version: FIGURE_VERSION,
        numerics: Numerics::Exact,
        inputs,
        outputs: &["png", "svg", "table"],
        labels: BTreeMap::from([
            ("stage".into(), "figure".into()),
            ("target".into(), name.to_string()),
        ]),
        resources: Wiring::small(memory_mb),
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_registered_once_and_found_by_its_name() {
        let names = kinds();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for n in &names {
            assert_eq!(lookup(n).unwrap().name(), *n);
        }
        assert_eq!(TargetKind::default().name(), "table");
        assert!(lookup("tabel").is_none());
    }

    #[test]
    fn the_schemas_default_kind_is_the_first_registered() {
        assert_eq!(
            crate::specs::schema::DEFAULT_TARGET_KIND,
            REGISTRY[0].name()
        );
    }

    #[test]
    fn no_kind_owns_a_field_every_kind_reads() {
        for t in REGISTRY {
            for (f, _) in t.own_fields() {
                assert!(!COMMON_TARGET_FIELDS.contains(f), "`{f}` of `{}`", t.name());
            }
        }
    }

    #[test]
    fn the_fields_one_kind_owns_are_owned_by_no_other() {
        let mut seen: Vec<&str> = Vec::new();
        for t in REGISTRY {
            for (f, _) in t.own_fields() {
                assert!(!seen.contains(f), "`{f}` owned twice");
                seen.push(f);
            }
        }
    }
}
