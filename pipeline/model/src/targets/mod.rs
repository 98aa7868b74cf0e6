//! The target kinds, one file each: what cells a kind reads, what it checks in its section,
//! the node it adds over its cells (a table or a figure, with the task that renders it), and
//! how it is shown. Adding a kind is one file here, registered in [`REGISTRY`]; the spec
//! names it as `kind:` and everything else (validation, the DAG, `run`'s and `report`'s
//! output) asks the kind.

use std::collections::BTreeMap;
use std::fmt;

use upcc_engine::InputDef;
use upcc_report::published::Comparison;
use upcc_report::TableLayout;

use crate::error::Result;
use crate::method::ResolvedMethod;
use crate::specs::schema::SpecFile;
use crate::specs::schema::SupervisionSpec;
use crate::specs::schema::TargetSpec;
use crate::specs::source::Problems;
use crate::wiring::{NodeSpec, Numerics, Wiring};

pub mod blind_spots;
pub mod constraint_values;
pub mod experts;
pub mod figure;
pub mod runtime;
pub mod selection;
pub mod sweep;
pub mod table;

pub use table::{TableInput, TableSource};

/// Version of the table stage (rendering lives in `upcc-report`).
pub const TABLE_VERSION: u32 = 1;
/// Version of the figure stage (drawing lives in `upcc-report`).
pub const FIGURE_VERSION: u32 = 1;

/// A cell × trial of a target and the node whose output the target reads (metrics for
/// tables, the expert node for expert tables, the training node for figures).
#[derive(Clone, Debug)]
pub struct CellTrial {
    pub coords: BTreeMap<String, String>,
    pub trial: u64,
    pub leaf: usize,
    pub output: &'static str,
    /// Figures: the training node of the same cell under oracle judgments (panels G, H).
    pub oracle_leaf: Option<usize>,
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
    pub file: &'a SpecFile,
    /// The spec's methods, resolved (those that failed to resolve are absent).
    pub methods: &'a BTreeMap<String, ResolvedMethod>,
    /// `params.constraints.diagnostic_pairs`.
    pub diagnostic_pairs: usize,
    /// The axes of its grid.
    pub axes: &'a [&'static str],
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
    /// How it is shown.
    fn view(&self) -> View;
    /// What its table node aggregates (table views).
    fn table_source(&self) -> TableSource {
        TableSource::Metrics
    }
    /// The axes spanning its columns when the spec names none (`None`: `method`, and
    /// `pretrain` when the grid has it).
    fn default_columns(&self) -> Option<&'static [&'static str]> {
        None
    }
    /// How its `published:` values are compared (`None`: it takes none).
    fn published(&self) -> Option<PublishedAs> {
        None
    }
    /// The default row and column axes of its published file.
    fn published_axes(&self) -> (&'static str, &'static str) {
        ("dataset", "supervision")
    }
    /// The target fields only this kind reads, with what each does (another kind that sets
    /// one is told so).
    fn own_fields(&self) -> &'static [(&'static str, &'static str)] {
        &[]
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

impl<'de> serde::Deserialize<'de> for TargetKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        lookup(&name).ok_or_else(|| {
            // Worded as serde words an unknown enum variant, so that spec errors explain it
            // the same way (with the nearest name as a hint).
            let known: Vec<String> = kinds().iter().map(|k| format!("`{k}`")).collect();
            serde::de::Error::custom(format!(
                "unknown variant `{name}`, expected one of {}",
                known.join(", ")
            ))
        })
    }
}

impl TargetKind {
    /// The axes spanning a target's columns: the spec's, else the kind's default, else
    /// `method` (and `pretrain` when the grid has it).
    pub fn columns(&self, target: &TargetSpec) -> Vec<String> {
        if let Some(c) = &target.columns {
            return c.clone();
        }
        if let Some(d) = self.default_columns() {
            return d.iter().map(|s| s.to_string()).collect();
        }
        if target.grid.pretrain.is_some() {
            vec!["method".into(), "pretrain".into()]
        } else {
            vec!["method".into()]
        }
    }
}

/// The axes of a target's grid, in display order.
pub fn axes_of(target: &TargetSpec, kind: TargetKind) -> Vec<&'static str> {
    let g = &target.grid;
    let mut a = vec!["dataset", "supervision"];
    match kind.cells() {
        Cells::ConstraintRecords => {
            a.extend(g.corruption.iter().map(|_| "corruption"));
            a.extend(g.budget.iter().map(|_| "budget"));
            return a;
        }
        Cells::Experts { .. } => return a,
        _ => {}
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

/// The kind-specific fields a target sets (those some kind lists in [`Target::own_fields`]).
fn fields_set(t: &TargetSpec) -> Vec<&'static str> {
    [
        ("x", t.x.is_some()),
        ("lines", t.lines.is_some()),
        ("x_labels", !t.x_labels.is_empty()),
        ("x_title", t.x_title.is_some()),
        ("oracle_panels", t.oracle_panels.is_some()),
    ]
    .into_iter()
    .filter_map(|(f, set)| set.then_some(f))
    .collect()
}

/// A field that another kind owns, set on this target: named, with the kind that reads it.
pub(crate) fn check_own_fields(cx: &CheckCx<'_>, p: &mut Problems<'_>) {
    let (t, kind) = (cx.name, cx.kind);
    for field in fields_set(cx.target) {
        if kind.own_fields().iter().any(|(f, _)| *f == field) {
            continue;
        }
        let owner = REGISTRY
            .iter()
            .find_map(|k| {
                k.own_fields()
                    .iter()
                    .find(|(f, _)| *f == field)
                    .map(|(_, what)| (k.name(), *what))
            })
            .expect("every kind-specific field has an owning kind");
        p.add(
            &["targets", t, field],
            format!(
                "target `{t}`: `{field}` {}; this target is of kind `{}`",
                owner.1,
                kind.name()
            ),
            Some(format!("drop it, or make the target `kind: {}`", owner.0)),
        );
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
    fn an_unknown_kind_is_refused_with_the_known_ones() {
        let e = serde_yaml_ng::from_str::<TargetKind>("tabel").unwrap_err();
        let m = e.to_string();
        assert!(m.contains("unknown variant `tabel`"), "{m}");
        for k in kinds() {
            assert!(m.contains(&format!("`{k}`")), "{m}");
        }
        let k: TargetKind = serde_yaml_ng::from_str("blind-spots").unwrap();
        assert_eq!(k.name(), "blind-spots");
    }

    #[test]
    fn every_kind_specific_field_has_one_owning_kind() {
        let spec: TargetSpec = serde_yaml_ng::from_str(
            "{grid: {dataset: [d], supervision: [s]}, x: a, lines: b, x_labels: {a: A}, x_title: T, oracle_panels: relabel}",
        )
        .unwrap();
        let set = fields_set(&spec);
        assert_eq!(set.len(), 5, "{set:?}");
        for f in set {
            let owners = REGISTRY
                .iter()
                .filter(|k| k.own_fields().iter().any(|(o, _)| *o == f))
                .count();
            assert_eq!(owners, 1, "`{f}`");
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
