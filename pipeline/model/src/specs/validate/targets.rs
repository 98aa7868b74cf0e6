//! Validating a spec's targets: each one's kind and own fields, its grid's names and values,
//! what its methods need of it, what its kind checks, the oracle runs figures derive, and the
//! published values its kind reads.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::nearest;
use crate::method::ResolvedMethod;
use crate::specs::axis::Axis;
use crate::specs::schema::{oracle_run_name, SpecFile, SupervisionSpec, TargetSpec};
use crate::specs::sections::MAX_NODES;
use crate::specs::source::Problems;
use crate::targets::{self, CheckCx, ResolvedTarget};

use super::names_of;

/// Resolve and check every target (`trials`: how many the spec runs); those of an unknown
/// kind, or whose own fields did not resolve, are left out.
pub(super) fn resolve_targets(
    file: &SpecFile,
    methods: &BTreeMap<String, ResolvedMethod>,
    diagnostic_pairs: usize,
    trials: usize,
    p: &mut Problems<'_>,
) -> BTreeMap<String, ResolvedTarget> {
    if file.targets.is_empty() {
        p.add(
            &["targets"],
            "the spec declares no targets",
            Some("add `targets: {main: {grid: {...}}}`".into()),
        );
    }
    let resolved: BTreeMap<String, ResolvedTarget> = file
        .targets
        .iter()
        .filter_map(|(t, target)| targets::resolve(t, target, p).map(|r| (t.clone(), r)))
        .collect();
    let mut node_estimate: u128 = 0;
    for (t, target) in &file.targets {
        // A target of an unknown kind, or whose own fields did not resolve, is reported once,
        // above.
        let Some(r) = resolved.get(t) else { continue };
        check_grid(file, methods, t, target, r, p);
        let axes = targets::axes_of(target, r.kind);
        // What this kind needs of its section, and the fields other kinds own.
        let cx = CheckCx {
            name: t,
            target,
            kind: r.kind,
            own: &r.own,
            file,
            methods,
            diagnostic_pairs,
            axes: &axes,
        };
        r.kind.check(&cx, p);
        check_shown(t, target, r, &axes, p);
        let g = &target.grid;
        let cells = (g.dataset.len() as u128)
            .saturating_mul(g.supervision.len().max(1) as u128)
            .saturating_mul(g.method.len().max(1) as u128)
            .saturating_mul(g.pretrain.as_ref().map_or(1, |v| v.len()).max(1) as u128)
            .saturating_mul(g.corruption.as_ref().map_or(1, |c| c.len()).max(1) as u128)
            .saturating_mul(g.budget.as_ref().map_or(1, |b| b.len()).max(1) as u128);
        node_estimate = node_estimate.saturating_add(cells.saturating_mul(trials as u128 * 6));
    }
    if node_estimate > MAX_NODES {
        p.add(
            &["trials"],
            format!("the targets would make about {node_estimate} nodes (cells × trials), more than any experiment; lower `trials` or the grids"),
            None,
        );
    }
    resolved
}

/// Check a target's grid: its names, its values, and what its methods need of it.
fn check_grid(
    file: &SpecFile,
    methods: &BTreeMap<String, ResolvedMethod>,
    t: &str,
    target: &TargetSpec,
    r: &ResolvedTarget,
    p: &mut Problems<'_>,
) {
    let at = |a: Axis| ["targets", t, "grid", a.name()];
    let g = &target.grid;
    let mut named = vec![
        (
            Axis::Dataset,
            &g.dataset,
            names_of(&file.datasets),
            "dataset",
        ),
        (
            Axis::Supervision,
            &g.supervision,
            names_of(&file.supervision),
            "supervision setting",
        ),
    ];
    // Kinds indexed by dataset and supervision only train no method.
    if !r.kind.cells().per_setting() {
        named.push((Axis::Method, &g.method, names_of(&file.methods), "method"));
    }
    for (axis, values, valid, what) in named {
        if values.is_empty() {
            p.add(
                &at(axis),
                format!("target `{t}`: `grid.{axis}` is empty"),
                None,
            );
        }
        for v in values {
            if !valid.contains(&v.as_str()) && !typo_reported(file, axis, v) {
                p.unknown(&at(axis), what, v, &valid);
            }
        }
    }
    for c in g.corruption.iter().flatten() {
        if !(0.0..=1.0).contains(c) {
            p.add(
                &at(Axis::Corruption),
                format!("target `{t}`: corruption {c} is outside [0, 1]"),
                None,
            );
        }
    }
    if g.budget.as_ref().is_some_and(|b| b.contains(&0)) {
        p.add(
            &at(Axis::Budget),
            format!("target `{t}`: a budget of 0 constraints"),
            None,
        );
    }
    for (m, r) in g.method.iter().filter_map(|m| Some((m, methods.get(m)?))) {
        let kind = r.method.kind();
        if r.method.needs_multi_expert() {
            for sup in &g.supervision {
                if !file
                    .supervision
                    .get(sup)
                    .is_some_and(SupervisionSpec::is_multi_expert)
                {
                    p.add(&at(Axis::Supervision), format!("target `{t}`: method `{m}` ({kind}) has one member per expert and needs a multi-expert supervision setting; `{sup}` is not one"), None);
                }
            }
        }
        if r.method.needs_validation(&r.settings) {
            for ds in &g.dataset {
                if file.datasets.get(ds).is_some_and(|d| d.validation == 0) {
                    p.add(
                        &["datasets", ds, "validation"],
                        format!("method `{m}` ({kind}) selects its hyperparameter by validation ACC, but dataset `{ds}` reserves no validation rows"),
                        Some("set `validation: N` on the dataset (the paper reserves 1000), or fix the hyperparameter (`volmax.lambda`, `ensemble.alpha`)".into()),
                    );
                }
            }
        }
        if g.pretrain.as_ref().is_some_and(|v| v.contains(&true)) && !r.method.pretrainable() {
            p.add(&at(Axis::Pretrain), format!("target `{t}`: method `{m}` ({kind}) has no pretraining; use `pretrain: [false]` for it, a separate target, or leave `pretrain` out of the grid (each method then runs as in the paper's main table)"), None);
        }
    }
    for sup in &g.supervision {
        let from_file = matches!(
            file.supervision.get(sup),
            Some(SupervisionSpec::File { .. })
        );
        if from_file && (g.corruption.is_some() || g.budget.is_some()) {
            p.add(&at(Axis::Supervision), format!("target `{t}`: supervision `{sup}` comes from a file, so it cannot vary `corruption` or `budget`"), None);
        }
    }
}

/// Check how a target is shown: its columns are axes of its grid (`axes`), its splits are
/// splits, and its grid's `pretrain` lists a value.
fn check_shown(
    t: &str,
    target: &TargetSpec,
    r: &ResolvedTarget,
    axes: &[Axis],
    p: &mut Problems<'_>,
) {
    let names: Vec<&str> = axes.iter().map(|a| a.name()).collect();
    for col in &r.kind.columns(target) {
        if names.contains(&col.as_str()) {
            continue;
        }
        let hint = if Axis::parse(col) == Some(Axis::Pretrain) {
            Some("pretraining is an axis only when the grid lists it: add `pretrain: [true, false]` (or the values you want) to the grid".to_string())
        } else {
            nearest(col, names.iter().copied())
                .map(|n| format!("did you mean `{n}`? (axes: {})", names.join(", ")))
        };
        p.add(
            &["targets", t, "columns"],
            format!("target `{t}`: column `{col}` is not an axis of its grid"),
            hint.or_else(|| Some(format!("axes: {}", names.join(", ")))),
        );
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
    if target.grid.pretrain.as_ref().is_some_and(|v| v.is_empty()) {
        p.add(
            &["targets", t, "grid", "pretrain"],
            format!("target `{t}`: `grid.pretrain` is empty"),
            None,
        );
    }
}

/// The oracle runs figures derive (`SUP.oracle`: panels G and H from a run on oracle
/// judgments, unless a figure says otherwise), by name.
pub(super) fn oracle_runs(
    file: &SpecFile,
    resolved: &BTreeMap<String, ResolvedTarget>,
    p: &mut Problems<'_>,
) -> BTreeMap<String, SupervisionSpec> {
    let mut runs = BTreeMap::new();
    for (t, target) in &file.targets {
        if !resolved.get(t).is_some_and(|r| r.kind.oracle_runs(&r.own)) {
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
            runs.insert(name, SupervisionSpec::Oracle { experts });
        }
    }
    runs
}

/// Read the published values of the targets that name them, as their kinds say (files
/// relative to `dir`).
pub(super) fn read_published(
    file: &SpecFile,
    resolved: &mut BTreeMap<String, ResolvedTarget>,
    dir: &Path,
    p: &mut Problems<'_>,
) {
    for (t, target) in &file.targets {
        if let (Some(ps), Some(r)) = (&target.published, resolved.get_mut(t)) {
            r.published = targets::published::read(t, ps, r.kind, dir, p);
        }
    }
}

/// Whether grid method `v` is missing only because the spec's `methods:` entry for it is
/// misspelt (`weighted-probpiar: {}`): that entry's problem already names `v`, and repeating it
/// here would suggest the typo back.
fn typo_reported(file: &SpecFile, axis: Axis, v: &str) -> bool {
    if axis != Axis::Method || crate::method::lookup(v).is_none() {
        return false;
    }
    let kinds = crate::method::kinds();
    file.methods.iter().any(|(name, entry)| {
        crate::method::lookup(name).is_none()
            && entry.get("kind").is_none()
            && crate::error::nearest(name, kinds.iter().copied()) == Some(v)
    })
}
