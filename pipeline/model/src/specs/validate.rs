//! Validating a loaded spec: every name, file, grid and parameter, all problems at once,
//! each placed at its line or `--set`; and what is known of each dataset's shape at load.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_yaml_ng::Value;
use upcc_report::TableSettings;
use upcc_stages::cluster::ClusterSettings;
use upcc_stages::constraints::ConstraintSettings;
use upcc_stages::expert::ClassifierParams;
use upcc_stages::features::{Scaling, SplitKind};

use serde::de::DeserializeOwned;
use upcc_stages::check::Check;

use super::embedded::embedded;
use super::schema::*;
use super::sections::*;
use super::spec::Spec;
use super::{resolver::*, source::*};
use crate::error::{nearest, Result};
use crate::method::{self, ResolvedMethod};
use crate::targets::TargetKind;

/// The longest spec name (it names a folder of the store).
pub const MAX_SPEC_NAME: usize = 100;

/// What is known of a dataset's shape at load: `expect:`'s sizes, else the head of its local
/// file (CSV, IDX, `.npy`; not Parquet or pickles, nor files not downloaded yet).
pub(crate) fn dataset_shape(d: &DatasetSpec, dir: &Path) -> Option<upcc_stages::features::Shape> {
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

pub(crate) fn validate(
    src: SpecSource,
    file: SpecFile,
    placed: Vec<(Vec<String>, String)>,
) -> Result<Spec> {
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
    let kinds = target_kinds(&file, &mut p);
    let mut node_estimate: u128 = 0;
    for (t, target) in &file.targets {
        // A target of an unknown kind is reported once, above.
        let Some(&kind) = kinds.get(t) else { continue };
        let at = |field: &'static str| ["targets", t.as_str(), "grid", field];
        let g = &target.grid;
        let experts = kind.cells().per_setting();
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
            if from_file && (g.corruption.is_some() || g.budget.is_some()) {
                p.add(&at("supervision"), format!("target `{t}`: supervision `{sup}` comes from a file, so it cannot vary `corruption` or `budget`"), None);
            }
        }
        let axes = crate::targets::axes_of(target, kind);
        // What this kind needs of its section, and the fields other kinds own.
        let cx = crate::targets::CheckCx {
            name: t,
            target,
            kind,
            file: &file,
            methods: &methods,
            diagnostic_pairs: constraints.diagnostic_pairs,
            axes: &axes,
        };
        kind.check(&cx, &mut p);
        crate::targets::check_own_fields(&cx, &mut p);
        for col in &kind.columns(target) {
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
        if kinds.get(t).map(|k| k.cells())
            != Some(crate::targets::Cells::Runs { diagnostics: true })
        {
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
        let Some(&kind) = kinds.get(t) else { continue };
        let at = |f: &'static str| ["targets", t.as_str(), "published", f];
        let Some(published_as) = kind.published() else {
            let tables: Vec<&str> = crate::targets::REGISTRY
                .iter()
                .filter(|k| k.published().is_some())
                .map(|k| k.name())
                .collect();
            p.add(&at("file"), format!("target `{t}`: `published` values are compared with tables (kinds {}); this target is of kind `{}`", tables.join(", "), kind.name()), None);
            continue;
        };
        for c in &ps.ignore {
            if !["pretrain", "corruption", "budget"].contains(&c.as_str()) {
                p.add(&at("ignore"), format!("target `{t}`: `published.ignore` lists `{c}`; only `pretrain`, `corruption` and `budget` can be left unmatched"), None);
            }
        }
        let (row_default, col_default) = kind.published_axes();
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
        let read = fs_err::read(&path)
            .map_err(|e| format!("cannot read `{}`: {e}", ps.file))
            .and_then(|bytes| {
                if published_as == crate::targets::PublishedAs::Scores {
                    upcc_report::published::read_scores(&bytes, &ps.file, &ps.table)
                        .map(|r| (r, vec![]))
                } else {
                    upcc_report::published::read_printed(&bytes, &ps.file, &ps.table)
                        .map(|c| (vec![], c))
                }
            });
        let read = read.and_then(|(rows, printed)| {
            // An experts table's values are accuracies: numbers.
            if published_as == crate::targets::PublishedAs::PrintedScores {
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
        kinds,
    })
}

pub(crate) fn names_of<T>(m: &BTreeMap<String, T>) -> Vec<&str> {
    m.keys().map(|k| k.as_str()).collect()
}

/// Each target's kind, looked up by its `kind:` name among the kinds upcc implements; an
/// unknown name is reported where it stands, worded as serde words an unknown variant (with
/// the nearest name as a hint), and its target left out.
fn target_kinds(file: &SpecFile, p: &mut Problems<'_>) -> BTreeMap<String, TargetKind> {
    let mut kinds = BTreeMap::new();
    for (t, target) in &file.targets {
        match crate::targets::lookup(&target.kind) {
            Some(k) => {
                kinds.insert(t.clone(), k);
            }
            None => {
                let known = crate::targets::kinds();
                let listed: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
                p.add(
                    &["targets", t.as_str(), "kind"],
                    format!(
                        "targets.{t}: unknown variant `{}`, expected one of {}",
                        target.kind,
                        listed.join(", ")
                    ),
                    nearest(&target.kind, known.iter().copied())
                        .map(|n| format!("did you mean `{n}`?")),
                );
            }
        }
    }
    kinds
}

/// A section of `params` as a settings type, checked; problems reported at `params.<name>`.
/// Take `seed` and `per_trial` out of section `name` (they choose the nodes, not the stage's
/// settings); the rest is the stage's.
pub(crate) fn take_sharing(
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

pub(crate) fn stage_section<T: DeserializeOwned + Check + Default>(
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
