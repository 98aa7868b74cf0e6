//! `upcc results`: the scores of every cell × trial in the store as data — one row each with
//! its coordinates, seed, the overrides that make it differ from the spec, ACC/NMI/ARI per
//! split, training time and node keys — and `--compare A B`, two runs side by side with
//! deltas. Reads the store; computes nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Map, Value};
use upcc_engine::{plan_with, NodeStatus, Store};
use upcc_model::error::{Error, Result};
use upcc_model::specs::axis::Axis;
use upcc_stages::metrics::Scores;

use super::context::*;
use super::frame::{emit, Format, Frame, Show, Values};
use crate::cli::{ResultsArgs, SpecArgs};

/// One cell × trial of the spec's tables.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// Targets whose tables show it.
    pub targets: Vec<String>,
    pub node: String,
    /// Axis name → coordinate, every axis.
    pub coords: BTreeMap<String, String>,
    pub trial: u64,
    pub status: NodeStatus,
    /// The parameters of the training it measures (`section.field` → value).
    pub params: BTreeMap<String, Value>,
    /// `section.field=value` where these parameters differ from the spec without `--set`.
    pub overrides: Vec<String>,
    pub scores: Vec<Scores>,
    /// Wall time of its training nodes (pretraining aside), from their records.
    pub train_s: Option<f64>,
    pub metrics_key: Option<String>,
    pub train_key: Option<String>,
}

impl Row {
    /// What identifies the cell × trial across two runs (its coordinates and trial).
    fn cell_key(&self) -> (Vec<(String, String)>, u64) {
        (
            self.coords
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            self.trial,
        )
    }

    fn score(&self, split: &str, metric: &str, nmi: upcc_report::NmiVariant) -> Option<f64> {
        let s = self.scores.iter().find(|s| s.split == split)?;
        Some(match metric {
            "acc" => s.acc,
            "ari" => s.ari,
            _ => match nmi {
                upcc_report::NmiVariant::Arithmetic => s.nmi_arithmetic,
                upcc_report::NmiVariant::Geometric => s.nmi_geometric,
            },
        })
    }
}

/// The rows of the cells `picks` picks, read from `store`; `base` holds the parameters of the
/// same nodes without `--set`; `plan`, when the caller has one, is `built.dag`'s.
pub(crate) fn collect(
    spec: &upcc_model::specs::Spec,
    built: &upcc_model::graph::Built,
    picks: &dyn Fn(&str, &BTreeMap<String, String>) -> bool,
    store: &Store,
    base: Option<&BTreeMap<String, BTreeMap<String, Value>>>,
    plan: Option<&[upcc_engine::PlanEntry]>,
) -> Result<Vec<Row>> {
    // The metrics leaves of the selected table cells, in target order, once each.
    let mut leaves: Vec<usize> = Vec::new();
    let mut targets_of: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for t in &built.targets {
        for c in &t.cells {
            if c.output != "metrics" || !picks(&t.name, &built.dag.node(c.leaf).labels) {
                continue;
            }
            let names = targets_of.entry(c.leaf).or_default();
            if names.is_empty() {
                leaves.push(c.leaf);
            }
            if !names.contains(&t.name) {
                names.push(t.name.clone());
            }
        }
    }
    if leaves.is_empty() {
        return Err(Error::user(
            "the selection picks no cell of a table whose scores `upcc results` could show",
        )
        .hint("results lists the cells of score tables (kind: table); `upcc status SPEC` lists every node"));
    }
    // The caller's plan of the whole DAG, else a plan of what the rows read.
    let restricted;
    let planned;
    let (dag, entries): (&upcc_engine::Dag, &[upcc_engine::PlanEntry]) = match plan {
        Some(e) => (&built.dag, e),
        None => {
            restricted = built.dag.restrict(&leaves);
            planned = plan_with(&restricted, store, &spec.file.name, None)?;
            (&restricted, &planned)
        }
    };
    let entry_of = |id: &str| dag.index_of(id).map(|i| &entries[i]);
    let mut rows = Vec::new();
    let mut healed = false;
    for leaf in leaves {
        let node = built.dag.node(leaf);
        let Some(e) = entry_of(&node.id) else {
            continue;
        };
        let cell = node.params.get("cell").cloned().unwrap_or(Value::Null);
        let coords: BTreeMap<String, String> = Axis::ALL
            .iter()
            .filter_map(|a| {
                cell.get(a.name())
                    .and_then(Value::as_str)
                    .map(|v| (a.name().to_string(), v.to_string()))
            })
            .collect();
        let trial = node
            .labels
            .get("trial")
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        let params: BTreeMap<String, Value> = node
            .params
            .get("params")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let overrides = match base.map(|b| b.get(&node.id)) {
            None => vec![],
            Some(None) => spec.overrides.iter().map(|o| o.arg.clone()).collect(),
            Some(Some(before)) => params
                .iter()
                .filter(|(k, v)| before.get(*k) != Some(v))
                .map(|(k, v)| format!("{k}={}", show_value(v)))
                .collect(),
        };
        let mut scores = Vec::new();
        let mut metrics_key = None;
        if e.status == NodeStatus::Fresh {
            if let Some(key) = e.key {
                metrics_key = Some(key.to_hex());
                if let Some(m) = store.read_manifest_intact(&key)? {
                    if let Some(out) = m.outputs.get("metrics") {
                        if let Some(bytes) = view_object(store, &key, &out.digest, &mut healed)? {
                            scores = upcc_stages::metrics::from_parquet(&bytes).map_err(|err| {
                                Error::internal(format!(
                                    "metrics of `{}` cannot be read: {err}",
                                    node.id
                                ))
                            })?;
                        }
                    }
                }
            }
        }
        // The training nodes this result measures: the device-trained ancestors, pretraining
        // and the experts aside.
        let (mut train_s, mut train_key) = (None::<f64>, None);
        let mut queue: VecDeque<usize> = dag.index_of(&node.id).into_iter().collect();
        let mut seen = BTreeSet::new();
        while let Some(i) = queue.pop_front() {
            if !seen.insert(i) {
                continue;
            }
            let n = dag.node(i);
            if n.numerics != "exact" && n.stage != "pretrain" && n.stage != "expert" {
                let pe = &entries[i];
                if let (NodeStatus::Fresh, Some(k)) = (pe.status, pe.key) {
                    train_key.get_or_insert_with(|| k.to_hex());
                    if let Some(m) = store.read_manifest_intact(&k)? {
                        *train_s.get_or_insert(0.0) += m.provenance.duration_s;
                    }
                }
                continue;
            }
            for (_, input) in &n.inputs {
                if let upcc_engine::InputDef::Node { node, .. } = input {
                    queue.push_back(node.0);
                }
            }
        }
        rows.push(Row {
            targets: targets_of[&leaf].clone(),
            node: node.id.clone(),
            coords,
            trial,
            status: if scores.is_empty() && e.status == NodeStatus::Fresh {
                NodeStatus::Missing
            } else {
                e.status
            },
            params,
            overrides,
            scores,
            train_s,
            metrics_key,
            train_key,
        });
    }
    Ok(rows)
}

/// A parameter value as `--set` would write it.
fn show_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The parameters of every metrics node of a spec loaded without `--set` (node id → params).
fn base_params(loaded: &Loaded) -> BTreeMap<String, BTreeMap<String, Value>> {
    loaded
        .built
        .dag
        .nodes()
        .iter()
        .filter(|n| n.stage == "metrics")
        .map(|n| {
            let p = n
                .params
                .get("params")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            (n.id.clone(), p)
        })
        .collect()
}

/// The splits the rows score, in the order train, val, test, then any other.
fn splits(rows: &[Row]) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for r in rows {
        for s in &r.scores {
            if !all.contains(&s.split) {
                all.push(s.split.clone());
            }
        }
    }
    let rank = |s: &str| match s {
        "test" => 0,
        "train" => 1,
        "val" => 2,
        _ => 3,
    };
    all.sort_by_key(|s| (rank(s), s.clone()));
    all
}

/// Rows and everything a reader needs to load them: the spec loaded (with `--set`), its store,
/// the rows.
fn load_rows(args: &SpecArgs, env: &Env) -> Result<(Loaded, Vec<Row>)> {
    let loaded = load(args, 1, env)?;
    let base = if args.set.is_empty() {
        None
    } else {
        let plain = SpecArgs {
            set: vec![],
            ..args.clone()
        };
        load_with(&plain, 1, loaded.compute.clone())
            .ok()
            .map(|l| base_params(&l))
    };
    let path = store_path(&env.store);
    let store = if path.join("STORE.json").exists() {
        open_store(&env.store, false)?
    } else {
        Store::view_nonexistent(&path)
    };
    let rows = collect(
        &loaded.spec,
        &loaded.built,
        &|t, l| loaded.selection.picks(t, l),
        &store,
        base.as_ref(),
        None,
    )?;
    Ok((loaded, rows))
}

const METRICS: [(&str, &str); 3] = [("acc", "ACC"), ("nmi", "NMI"), ("ari", "ARI")];

/// The coordinate columns: every axis (the terminal leaves out those no row varies, naming
/// them above the table).
fn coord_columns(frame: &mut Frame, rows: &[Row], terminal: bool, constant: &mut Vec<String>) {
    for a in Axis::ALL {
        let vals: Vec<Option<String>> = rows
            .iter()
            .map(|r| r.coords.get(a.name()).cloned())
            .collect();
        let distinct: BTreeSet<&Option<String>> = vals.iter().collect();
        if terminal && distinct.len() == 1 && !matches!(a, Axis::Dataset | Axis::Method) {
            if let Some(Some(v)) = distinct.into_iter().next() {
                constant.push(format!("{}={v}", a.name()));
            }
            continue;
        }
        let values = match a {
            Axis::Pretrain => Values::Bool(
                vals.iter()
                    .map(|v| v.as_deref().map(|s| s == "true"))
                    .collect(),
            ),
            Axis::Corruption => Values::Float(
                vals.iter()
                    .map(|v| v.as_deref().and_then(|s| s.parse().ok()))
                    .collect(),
            ),
            Axis::Budget => Values::Int(
                vals.iter()
                    .map(|v| v.as_deref().and_then(|s| s.parse().ok()))
                    .collect(),
            ),
            _ => Values::Str(vals),
        };
        frame.push(a.name(), Show::Plain, values);
    }
}

/// The frame of `upcc results` (one side).
fn results_frame(
    rows: &[Row],
    nmi: upcc_report::NmiVariant,
    terminal: bool,
) -> (Frame, Vec<String>) {
    let mut f = Frame::default();
    let mut constant = Vec::new();
    coord_columns(&mut f, rows, terminal, &mut constant);
    f.push(
        "trial",
        Show::Plain,
        Values::Int(rows.iter().map(|r| Some(r.trial as i64)).collect()),
    );
    if !terminal {
        f.push(
            "seed",
            Show::Plain,
            Values::Int(rows.iter().map(|r| Some(r.trial as i64)).collect()),
        );
    }
    if !terminal || rows.iter().any(|r| !r.overrides.is_empty()) {
        f.push(
            "overrides",
            Show::Plain,
            Values::Str(rows.iter().map(|r| Some(r.overrides.join(" "))).collect()),
        );
    }
    if !terminal || rows.iter().any(|r| r.status != NodeStatus::Fresh) {
        f.push(
            "status",
            Show::Plain,
            Values::Str(
                rows.iter()
                    .map(|r| Some(status_word(r.status).to_string()))
                    .collect(),
            ),
        );
    }
    for split in splits(rows) {
        for (m, label) in METRICS {
            let name = if terminal {
                format!("{split} {label}")
            } else {
                format!("{split}_{m}")
            };
            f.push(
                name,
                Show::Percent,
                Values::Float(rows.iter().map(|r| r.score(&split, m, nmi)).collect()),
            );
        }
    }
    f.push(
        if terminal { "train s" } else { "train_seconds" },
        Show::Seconds,
        Values::Float(rows.iter().map(|r| r.train_s).collect()),
    );
    f.push(
        if terminal {
            "metrics key"
        } else {
            "metrics_key"
        },
        Show::Key,
        Values::Str(rows.iter().map(|r| r.metrics_key.clone()).collect()),
    );
    if !terminal {
        f.push(
            "train_key",
            Show::Key,
            Values::Str(rows.iter().map(|r| r.train_key.clone()).collect()),
        );
        f.push(
            "node",
            Show::Plain,
            Values::Str(rows.iter().map(|r| Some(r.node.clone())).collect()),
        );
        f.push(
            "targets",
            Show::Plain,
            Values::Str(rows.iter().map(|r| Some(r.targets.join(","))).collect()),
        );
    }
    (f, constant)
}

/// The long table of computed results: one row per cell trial and split, every coordinate
/// typed, scores in float64 (the report's `trials.parquet`).
pub(crate) fn long_frame(rows: &[Row]) -> Frame {
    let mut long: Vec<(&Row, &Scores)> = Vec::new();
    for r in rows {
        for s in &r.scores {
            long.push((r, s));
        }
    }
    let expanded: Vec<Row> = long.iter().map(|(r, _)| (*r).clone()).collect();
    let mut f = Frame::default();
    coord_columns(&mut f, &expanded, false, &mut Vec::new());
    let col = |g: &dyn Fn(&Row, &Scores) -> Option<f64>| {
        Values::Float(long.iter().map(|(r, s)| g(r, s)).collect())
    };
    f.push(
        "trial",
        Show::Plain,
        Values::Int(long.iter().map(|(r, _)| Some(r.trial as i64)).collect()),
    );
    f.push(
        "split",
        Show::Plain,
        Values::Str(long.iter().map(|(_, s)| Some(s.split.clone())).collect()),
    );
    f.push(
        "n",
        Show::Plain,
        Values::Int(long.iter().map(|(_, s)| Some(i64::from(s.n))).collect()),
    );
    f.push("acc", Show::Percent, col(&|_, s| Some(s.acc)));
    f.push(
        "nmi_arithmetic",
        Show::Percent,
        col(&|_, s| Some(s.nmi_arithmetic)),
    );
    f.push(
        "nmi_geometric",
        Show::Percent,
        col(&|_, s| Some(s.nmi_geometric)),
    );
    f.push("ari", Show::Percent, col(&|_, s| Some(s.ari)));
    f.push("train_seconds", Show::Seconds, col(&|r, _| r.train_s));
    f.push(
        "metrics_key",
        Show::Key,
        Values::Str(long.iter().map(|(r, _)| r.metrics_key.clone()).collect()),
    );
    f
}

pub fn results(args: &ResultsArgs, env: &Env) -> Result<i32> {
    let format = if args.spec.json {
        Format::Json
    } else {
        args.format
    };
    let terminal = format == Format::Table;
    if !args.compare.is_empty() {
        return compare(args, env, format);
    }
    let (loaded, rows) = load_rows(&args.spec, env)?;
    let nmi = loaded.spec.params.table.nmi;
    let (frame, constant) = results_frame(&rows, nmi, terminal);
    let computed = rows.iter().filter(|r| !r.scores.is_empty()).count();
    let mut preamble = Vec::new();
    if !constant.is_empty() {
        preamble.push(format!("# {}", constant.join("  ")));
    }
    if !loaded.spec.overrides.is_empty() {
        preamble.push(format!(
            "# with {}",
            loaded
                .spec
                .overrides
                .iter()
                .map(|o| format!("--set {}", o.arg))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    preamble.push(format!(
        "# scores in percent; NMI {} normalisation",
        nmi_name(nmi)
    ));
    let mut extra = Map::new();
    extra.insert("spec".into(), json!(loaded.spec.display));
    extra.insert(
        "overrides".into(),
        json!(loaded
            .spec
            .overrides
            .iter()
            .map(|o| &o.arg)
            .collect::<Vec<_>>()),
    );
    extra.insert("nmi".into(), json!(nmi_name(nmi)));
    emit(&frame, format, args.out.as_deref(), &preamble, extra)?;
    if computed < rows.len() {
        eprintln!(
            "upcc: {} of {} results are in the store; `{}` computes the rest",
            computed,
            rows.len(),
            suggest_run(&args.spec, env)
        );
    }
    Ok(0)
}

fn nmi_name(n: upcc_report::NmiVariant) -> &'static str {
    match n {
        upcc_report::NmiVariant::Arithmetic => "arithmetic",
        upcc_report::NmiVariant::Geometric => "geometric",
    }
}

/// The `upcc run` command that computes what a command on `args` showed as missing, with the
/// user's store and overrides.
pub(crate) fn suggest_run(args: &SpecArgs, env: &Env) -> String {
    run_command(&env.store, &args.spec_and_selectors, &args.set)
}

/// `upcc [--store DIR] run WORDS… [--set …]`: a command to suggest, keeping the user's store
/// and overrides.
pub(crate) fn run_command(
    store: &Option<std::path::PathBuf>,
    words: &[String],
    sets: &[String],
) -> String {
    command("run", store, words, sets)
}

/// `upcc [--store DIR] VERB WORDS… [--set …]` (see [`run_command`]).
pub(crate) fn command(
    verb: &str,
    store: &Option<std::path::PathBuf>,
    words: &[String],
    sets: &[String],
) -> String {
    let mut parts = vec!["upcc".to_string()];
    if let Some(s) = store {
        parts.push(format!("--store {}", shell_word(&s.to_string_lossy())));
    }
    parts.push(verb.into());
    parts.extend(words.iter().map(|s| shell_word(s)));
    for s in sets {
        parts.push(format!("--set {}", shell_word(s)));
    }
    parts.join(" ")
}

/// A word as a POSIX shell reads it back (single-quoted when it needs to be).
pub(crate) fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// One side of `--compare`: a spec file (with the command's selectors and `--set`s), or a
/// group of `--set`s (`train.epochs=10 train.lr=0.01`, on top of the command's), or `-` for
/// the command's spec and `--set`s as they are.
fn side(main: &SpecArgs, s: &str) -> SpecArgs {
    let mut a = main.clone();
    let t = s.trim();
    if t == "-" || t.is_empty() {
        return a;
    }
    if t.contains('=') {
        a.set.extend(t.split_whitespace().map(String::from));
    } else {
        a.spec_and_selectors[0] = t.to_string();
    }
    a
}

fn compare(args: &ResultsArgs, env: &Env, format: Format) -> Result<i32> {
    let [a_arg, b_arg] = args.compare.as_slice() else {
        return Err(Error::user("--compare takes two runs: A B")
            .hint("e.g. `--compare - train.epochs=10` (the spec as it is against one override), or two spec files"));
    };
    let terminal = format == Format::Table;
    let (la, ra) = load_rows(&side(&args.spec, a_arg), env)?;
    let (_, rb) = load_rows(&side(&args.spec, b_arg), env)?;
    let nmi = la.spec.params.table.nmi;
    let index_b: BTreeMap<_, &Row> = rb.iter().map(|r| (r.cell_key(), r)).collect();
    let mut pairs: Vec<(Option<&Row>, Option<&Row>)> = Vec::new();
    let mut matched = BTreeSet::new();
    for r in &ra {
        let k = r.cell_key();
        let b = index_b.get(&k).copied();
        if b.is_some() {
            matched.insert(k);
        }
        pairs.push((Some(r), b));
    }
    for r in &rb {
        if !matched.contains(&r.cell_key()) {
            pairs.push((None, Some(r)));
        }
    }
    // Parameters that differ between the two runs, per parameter: A's value → B's (dvc's
    // `params diff`), over the cells both have.
    let mut diff: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (a, b) in &pairs {
        if let (Some(a), Some(b)) = (a, b) {
            let keys: BTreeSet<&String> = a.params.keys().chain(b.params.keys()).collect();
            for k in keys {
                let (x, y) = (a.params.get(k), b.params.get(k));
                if x != y {
                    diff.entry(k.clone()).or_default().insert((
                        x.map(show_value).unwrap_or_else(|| "—".into()),
                        y.map(show_value).unwrap_or_else(|| "—".into()),
                    ));
                }
            }
        }
    }
    let either = |p: &(Option<&Row>, Option<&Row>)| p.0.or(p.1).expect("one side").clone();
    let merged: Vec<Row> = pairs.iter().map(either).collect();
    let mut f = Frame::default();
    let mut constant = Vec::new();
    coord_columns(&mut f, &merged, terminal, &mut constant);
    f.push(
        "trial",
        Show::Plain,
        Values::Int(merged.iter().map(|r| Some(r.trial as i64)).collect()),
    );
    let all: Vec<Row> = ra.iter().chain(&rb).cloned().collect();
    for split in splits(&all) {
        if terminal && split != "test" {
            continue;
        }
        for (m, label) in METRICS {
            let a: Vec<Option<f64>> = pairs
                .iter()
                .map(|p| p.0.and_then(|r| r.score(&split, m, nmi)))
                .collect();
            let b: Vec<Option<f64>> = pairs
                .iter()
                .map(|p| p.1.and_then(|r| r.score(&split, m, nmi)))
                .collect();
            let d: Vec<Option<f64>> = a
                .iter()
                .zip(&b)
                .map(|(x, y)| Some(y.as_ref()? - x.as_ref()?))
                .collect();
            let (na, nb, nd) = if terminal {
                (
                    format!("{label} A"),
                    format!("{label} B"),
                    format!("Δ{label}"),
                )
            } else {
                (
                    format!("a_{split}_{m}"),
                    format!("b_{split}_{m}"),
                    format!("delta_{split}_{m}"),
                )
            };
            f.push(na, Show::Percent, Values::Float(a));
            f.push(nb, Show::Percent, Values::Float(b));
            f.push(nd, Show::Delta, Values::Float(d));
        }
    }
    let mut preamble = vec![
        format!("# A: {}", describe_side(a_arg, &args.spec)),
        format!("# B: {}", describe_side(b_arg, &args.spec)),
    ];
    if !constant.is_empty() {
        preamble.push(format!("# {}", constant.join("  ")));
    }
    if diff.is_empty() {
        preamble.push("# parameters: the same in A and B".into());
    } else {
        preamble.push("# parameters that differ (A → B):".into());
        for (k, vals) in &diff {
            let v: Vec<String> = vals.iter().map(|(x, y)| format!("{x} → {y}")).collect();
            preamble.push(format!("#   {k}: {}", v.join(", ")));
        }
    }
    preamble.push(format!(
        "# test scores in percent, Δ = B − A in points; NMI {} normalisation",
        nmi_name(nmi)
    ));
    let mut extra = Map::new();
    extra.insert("a".into(), json!(describe_side(a_arg, &args.spec)));
    extra.insert("b".into(), json!(describe_side(b_arg, &args.spec)));
    extra.insert(
        "params_diff".into(),
        json!(diff
            .iter()
            .map(|(k, v)| (
                k.clone(),
                v.iter()
                    .map(|(x, y)| json!({"a": x, "b": y}))
                    .collect::<Vec<_>>()
            ))
            .collect::<BTreeMap<_, _>>()),
    );
    emit(&f, format, args.out.as_deref(), &preamble, extra)?;
    let missing = pairs
        .iter()
        .filter(|(a, b)| {
            a.is_none_or(|r| r.scores.is_empty()) || b.is_none_or(|r| r.scores.is_empty())
        })
        .count();
    if missing > 0 {
        eprintln!(
            "upcc: {missing} of {} cells lack a result on one side; `upcc run` with that side's spec and --set computes them",
            pairs.len()
        );
    }
    Ok(0)
}

fn describe_side(s: &str, main: &SpecArgs) -> String {
    let a = side(main, s);
    let mut parts = vec![a.spec_and_selectors[0].clone()];
    parts.extend(a.set.iter().map(|s| format!("--set {s}")));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggested_commands_keep_the_store_and_the_overrides_quoted() {
        let store = Some(std::path::PathBuf::from("/data/my store"));
        let c = command(
            "cancel",
            &store,
            &["experiments/smoke.yaml".into()],
            &["train.hidden=[64,64]".into(), "train.epochs=3".into()],
        );
        assert_eq!(
            c,
            "upcc --store '/data/my store' cancel experiments/smoke.yaml --set 'train.hidden=[64,64]' --set train.epochs=3"
        );
        assert_eq!(
            run_command(&None, &["smoke".into(), "method=probpair".into()], &[]),
            "upcc run smoke method=probpair"
        );
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
