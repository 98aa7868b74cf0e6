//! Validating a loaded spec: every name, file, grid and parameter, all problems at once,
//! each placed at its line or `--set`; and what is known of each dataset's shape at load.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_yaml_ng::Value;
use upcc_report::TableSettings;
use upcc_stages::cluster::ClusterSettings;
use upcc_stages::constraints::ConstraintSettings;
use upcc_stages::expert::ClassifierParams;

use serde::de::DeserializeOwned;
use upcc_stages::check::Check;

use super::embedded::embedded;
use super::schema::*;
use super::sections::*;
use super::source::*;
use super::spec::Spec;
use crate::error::Result;
use crate::method;

mod datasets;
mod methods;
mod targets;

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
        Some(e) => upcc_stages::features::peek_shape(d.format, None, embedded(e)),
        None => upcc_stages::features::peek_shape(d.format, Some(&dir.join(file)), None),
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
    check_names(&file, &mut p);
    datasets::check_datasets(&file, &src.dir, &mut p);
    check_supervision(&file, &src.dir, &mut p);
    let trials = trials_of(&file, &mut p);
    let (params, broken) = stage_params(&file, &mut p);
    let methods = methods::resolve_methods(&file, &broken, &mut p);
    check_executor(&file, &mut p);
    let diagnostic_pairs = params.constraints.diagnostic_pairs;
    let mut resolved =
        targets::resolve_targets(&file, &methods, diagnostic_pairs, trials.len(), &mut p);
    let oracle_runs = targets::oracle_runs(&file, &resolved, &mut p);
    targets::read_published(&file, &mut resolved, &src.dir, &mut p);
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
        params,
        methods,
        target_order: vec![],
        overrides: vec![],
        document: serde_yaml_ng::Value::Null,
        oracle_runs,
        shapes,
        targets: resolved,
    })
}

/// The spec's name, and the names of its entries.
fn check_names(file: &SpecFile, p: &mut Problems<'_>) {
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
}

/// Each supervision setting's levels and sizes, and its file (relative to `dir`).
fn check_supervision(file: &SpecFile, dir: &Path, p: &mut Problems<'_>) {
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
                if !dir.join(path).exists() {
                    p.add(
                        &at("path"),
                        format!("supervision `{name}`: constraints file `{path}` not found"),
                        Some(format!(
                            "paths are relative to the spec's folder `{}`",
                            dir.display()
                        )),
                    );
                }
            }
        }
    }
}

/// The trials' seeds: `trials` is a count or a list of seeds.
fn trials_of(file: &SpecFile, p: &mut Problems<'_>) -> Vec<u64> {
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
    trials
}

/// The stage sections every method shares, checked, and the names of the sections that are
/// broken (reported here once, not once per method that reads them).
fn stage_params(file: &SpecFile, p: &mut Problems<'_>) -> (StageParams, BTreeSet<String>) {
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
        p,
        &mut sections,
        "expert",
        Sharing {
            seed: 0,
            per_trial: false,
        },
    );
    let pretrain_sharing = take_sharing(
        p,
        &mut sections,
        "pretrain",
        Sharing {
            seed: 0,
            per_trial: false,
        },
    );
    let expert: ClassifierParams = stage_section(p, &sections, "expert", &mut broken);
    let constraints: ConstraintSettings =
        stage_section(p, &file.params, "constraints", &mut broken);
    let cluster: ClusterSettings = stage_section(p, &file.params, "cluster", &mut broken);
    let table: TableSettings = stage_section(p, &file.params, "table", &mut broken);
    let pretrain = PretrainSpec {
        settings: stage_section(p, &sections, "pretrain", &mut broken),
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
    (
        StageParams {
            expert,
            expert_sharing,
            constraints,
            pretrain,
            cluster,
            table,
        },
        broken,
    )
}

/// The executor section: a known kind, and Slurm settings in range.
fn check_executor(file: &SpecFile, p: &mut Problems<'_>) {
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
}

pub(crate) fn names_of<T>(m: &BTreeMap<String, T>) -> Vec<&str> {
    m.keys().map(|k| k.as_str()).collect()
}

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
