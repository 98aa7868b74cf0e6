//! The researcher's workbench: `upcc results` (every run's scores as data, `--compare`),
//! `upcc config`, overrides that say what they did, code in the key, and the report's
//! per-trial table.

use polars::prelude::{ParquetReader, SerReader};
use serde_json::Value;

use crate::util::*;

/// `upcc results SPEC ARGS… --format json`.
fn results_json(env: &Env, args: &[&str]) -> Value {
    let spec = env.spec();
    let mut a = vec!["results", spec.as_str()];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--format", "json"]);
    let r = env.upcc(&a);
    assert_eq!(r.code, 0, "{r:?}");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

fn only_row(v: &Value) -> &Value {
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    &rows[0]
}

const CELL: [&str; 3] = ["method=probpair", "pretrain=false", "trial=1"];

#[test]
fn results_say_which_run_is_which_and_compare_two() {
    let env = Env::new();
    env.run_ok(&[]);
    env.run_ok(&["method=probpair", "--set", "train.epochs=5"]);

    // Every cell trial of the spec as written: 2 methods × 2 pretraining × 2 trials.
    let all = results_json(&env, &[]);
    let rows = all["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "{all}");
    for r in rows {
        assert_eq!(r["status"], "fresh", "{r}");
        assert_eq!(r["overrides"], "", "{r}");
        assert_eq!(r["dataset"], "blobs");
        assert_eq!(r["seed"], r["trial"]);
        assert!(r["pretrain"].is_boolean(), "{r}");
        for m in [
            "test_acc",
            "test_nmi",
            "test_ari",
            "train_acc",
            "train_seconds",
        ] {
            assert!(r[m].as_f64().is_some_and(|x| x >= 0.0), "{m}: {r}");
        }
        assert_eq!(r["metrics_key"].as_str().unwrap().len(), 64);
        assert_eq!(r["train_key"].as_str().unwrap().len(), 64);
    }

    // One cell, with and without the override: told apart by the override and the key.
    let mut with = CELL.to_vec();
    with.extend(["--set", "train.epochs=5"]);
    let base = results_json(&env, &CELL);
    let more = results_json(&env, &with);
    let (b, m) = (only_row(&base), only_row(&more));
    assert_eq!(m["overrides"], "train.epochs=5");
    assert_ne!(b["metrics_key"], m["metrics_key"]);
    assert_eq!(more["overrides"], serde_json::json!(["train.epochs=5"]));

    // Both in one command.
    let mut cmp_args = CELL.to_vec();
    cmp_args.extend(["--compare", "-", "train.epochs=5"]);
    let cmp = results_json(&env, &cmp_args);
    let c = only_row(&cmp);
    assert_eq!(c["a_test_nmi"], b["test_nmi"]);
    assert_eq!(c["b_test_nmi"], m["test_nmi"]);
    let delta = c["delta_test_nmi"].as_f64().unwrap();
    let expect = m["test_nmi"].as_f64().unwrap() - b["test_nmi"].as_f64().unwrap();
    assert!((delta - expect).abs() < 1e-12, "{c}");
    assert_eq!(
        cmp["params_diff"]["train.epochs"],
        serde_json::json!([{"a": "3", "b": "5"}]),
        "{cmp}"
    );
    let spec = env.spec();
    let mut t = vec!["results", spec.as_str()];
    t.extend_from_slice(&cmp_args);
    let term = env.upcc(&t);
    assert_eq!(term.code, 0, "{term:?}");
    assert!(
        term.stdout.contains("train.epochs: 3 → 5"),
        "{}",
        term.stdout
    );
    assert!(term.stdout.contains("ΔNMI"), "{}", term.stdout);

    // The metrics result itself says what it measured (manifest and table).
    let man = manifest(&env, &spec, "metrics/blobs/lv0.1/probpair/nopre/t1", &[]);
    let p = &man["material"]["params"];
    assert_eq!(p["cell"]["method"], "probpair", "{p}");
    assert_eq!(p["cell"]["trial"], "1");
    assert_eq!(p["params"]["train.epochs"], 3);
    assert_eq!(p["params"]["constraints.corruption"], 0.3);

    // CSV and Parquet carry the same rows.
    let mut csv_args = vec!["results", spec.as_str()];
    csv_args.extend_from_slice(&CELL);
    csv_args.extend(["--format", "csv"]);
    let csv = env.upcc(&csv_args);
    assert_eq!(csv.code, 0, "{csv:?}");
    assert_eq!(csv.stdout.lines().count(), 2, "{}", csv.stdout);
    assert!(csv.stdout.starts_with("dataset,supervision,"));
    let out = env.path("r.parquet");
    let mut pq_args = vec!["results", spec.as_str()];
    pq_args.extend(["--format", "parquet", "--out", out.to_str().unwrap()]);
    let pq = env.upcc(&pq_args);
    assert_eq!(pq.code, 0, "{pq:?}");
    let df = ParquetReader::new(std::fs::File::open(&out).unwrap());
    let df = df.finish().unwrap();
    assert_eq!(df.height(), 8);
    assert!(df.column("test_nmi").unwrap().f64().is_ok());
    assert!(df.column("pretrain").unwrap().bool().is_ok());

    // polars over the store, as the README shows it.
    if let Ok(python) = std::env::var("UPCC_TEST_PYTHON") {
        let script = format!(
            r#"
import glob, json, polars as pl
ms = [json.load(open(p)) for p in glob.glob("{store}/nodes/*/*.json")]
df = pl.concat([pl.read_parquet(f"{store}/objects/{{d[:2]}}/{{d[2:]}}") for m in ms if m["material"]["stage"] == "metrics" for d in [m["outputs"]["metrics"]["digest"]]], how="diagonal_relaxed")
print(df.filter(method="probpair", dataset="blobs", trial=1, split="test", pretrain=False).sort("train.epochs").select("train.epochs", "nmi_geometric").write_json())
"#,
            store = env.store().display()
        );
        let o = std::process::Command::new(python)
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "polars (installed by .ci/run) over the store: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got: Value = serde_json::from_slice(&o.stdout).unwrap();
        let got = got.as_array().unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0]["train.epochs"], 3);
        assert_eq!(got[0]["nmi_geometric"], b["test_nmi"]);
        assert_eq!(got[1]["train.epochs"], 5);
        assert_eq!(got[1]["nmi_geometric"], m["test_nmi"]);
    } else {
        eprintln!("UPCC_TEST_PYTHON is not set: the polars reading is not checked here");
    }
}

#[test]
fn results_of_cells_not_computed_say_how_to_compute_them() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&[
        "results",
        &spec,
        "method=probpair",
        "--set",
        "train.epochs=4",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("missing"), "{}", r.stdout);
    let store = env.store();
    assert!(
        r.stderr.contains(&format!(
            "0 of 4 results are in the store; `upcc --store {} run {spec} method=probpair --set train.epochs=4`",
            store.display()
        )),
        "{}",
        r.stderr
    );
    assert!(!store.exists(), "results creates no store");
    let bad = env.upcc(&["results", &spec, "--format", "parquet"]);
    // stdout is a pipe here, so Parquet goes to it.
    assert_eq!(bad.code, 0, "{bad:?}");
}

#[test]
fn config_prints_the_resolved_spec_and_overrides_name_what_shadows_them() {
    let env = Env::new();
    let spec_text = TINY_SPEC.replace(
        "  weighted-probpair: {}",
        "  weighted-probpair: {train: {epochs: 4}}",
    );
    env.write("spec.yaml", &spec_text);
    let spec = env.spec();
    let r = env.upcc(&["config", &spec, "--set", "train.epochs=7", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let c = r.json();
    assert_eq!(c["methods"]["probpair"]["train"]["epochs"], 7, "{c}");
    assert_eq!(c["methods"]["probpair"]["kind"], "probpair");
    assert_eq!(c["methods"]["weighted-probpair"]["train"]["epochs"], 4);
    // Defaults filled in.
    assert!(c["methods"]["probpair"]["train"]["lr"].is_number(), "{c}");
    assert_eq!(c["params"]["cluster"]["n_init"], 2);
    assert!(c["params"]["constraints"]["diagnostic_pairs"].is_number());
    assert_eq!(c["trials"], serde_json::json!([1, 2]));
    assert_eq!(c["overrides"], serde_json::json!(["train.epochs=7"]));
    let note = "`--set train.epochs=7` does not apply to method `weighted-probpair`: its own `methods.weighted-probpair.train.epochs` = 4 wins";
    assert!(r.stderr.contains(note), "{}", r.stderr);
    // Every command that reads the spec says it.
    let st = env.upcc(&["status", &spec, "--set", "train.epochs=7"]);
    assert!(st.stderr.contains(note), "{}", st.stderr);
    // Without a shadowing entry, no note.
    let plain = env.upcc(&["status", &spec, "--set", "cluster.n_init=3"]);
    assert!(!plain.stderr.contains("does not apply"), "{}", plain.stderr);
    let y = env.upcc(&["config", &spec]);
    assert_eq!(y.code, 0, "{y:?}");
    assert!(y.stdout.starts_with("# upcc config"), "{}", y.stdout);
    assert!(y.stdout.contains("weighted-probpair:"), "{}", y.stdout);
}

/// Status and run of the tiny spec with `UPCC_TEST_CODE_EDIT` (a stage file read as edited).
fn with_edit(env: &Env, file: &str, args: &[&str]) -> Ran {
    let mut c = env.command(&env.store(), args);
    c.env("UPCC_TEST_CODE_EDIT", file);
    ran(c.output().unwrap())
}

#[test]
fn editing_a_stage_marks_its_results_and_early_cutoff_keeps_the_rest() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let edit = "stages/core/src/cluster.rs";
    let st = with_edit(&env, edit, &["status", &spec, "--json"]);
    assert_eq!(st.code, 0, "{st:?}");
    let nodes = st.json()["nodes"].as_array().unwrap().clone();
    let of =
        |stage: &str| -> Vec<&Value> { nodes.iter().filter(|n| n["stage"] == stage).collect() };
    assert_eq!(of("cluster").len(), 8);
    for n in of("cluster") {
        assert_eq!(n["status"], "stale", "{n}");
        assert_eq!(
            n["reasons"],
            serde_json::json!([format!("code changed: {edit}")]),
            "{n}"
        );
    }
    for n in of("train").into_iter().chain(of("pretrain")) {
        assert_eq!(n["status"], "fresh", "{n}");
    }
    // Kept on request: nothing to compute.
    let keep = with_edit(
        &env,
        edit,
        &["--keep-code-changes", "status", &spec, "--json"],
    );
    let j = keep.json();
    assert_eq!(j["stale"], 0, "{j}");
    let cluster = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["stage"] == "cluster")
        .unwrap()
        .clone();
    assert!(
        cluster["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("kept although its code changed"),
        "{cluster}"
    );
    let run_keep = with_edit(
        &env,
        edit,
        &[
            "--keep-code-changes",
            "run",
            &spec,
            "--json",
            "--progress",
            "none",
        ],
    );
    assert_eq!(run_keep.code, 0, "{run_keep:?}");
    assert!(ids_with(&run_keep.json(), "executed").is_empty());
    // By default the edited stage reruns; k-means gives the same bits, so nothing below it
    // does (early cutoff).
    let run = with_edit(&env, edit, &["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(run.code, 0, "{run:?}");
    let executed = ids_with(&run.json(), "executed");
    assert_eq!(executed.len(), 8, "{executed:?}");
    assert!(
        executed.iter().all(|id| id.starts_with("cluster/")),
        "{executed:?}"
    );
    // A real rebuild's digests differ from the edit's: the unedited build reads its own again.
    let back = env.upcc(&["status", &spec, "--json"]);
    assert_eq!(back.json()["stale"], 0);
    // Both builds' results are kept by gc from either (a shared store's other users).
    for edited in [false, true] {
        let args = ["gc", spec.as_str(), "--grace-minutes", "0", "--dry-run"];
        let gc = if edited {
            with_edit(&env, edit, &args)
        } else {
            env.upcc(&args)
        };
        assert_eq!(gc.code, 0, "{gc:?}");
        assert!(gc.stdout.starts_with("dry run: 0 results"), "{}", gc.stdout);
    }
}

#[test]
fn report_writes_the_trials_the_resolved_spec_and_commands_that_keep_the_overrides() {
    let env = Env::new();
    env.run_ok(&["method=probpair"]);
    let spec = env.spec();
    let out = env.path("rep");
    let r = env.upcc(&[
        "report",
        &spec,
        "--set",
        "cluster.n_init=2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(
        html.contains("With overrides: <code>--set cluster.n_init=2</code>"),
        "{html}"
    );
    let want = format!(
        "<code>upcc --store {} run {spec} target=main --set cluster.n_init=2</code> computes them",
        env.store().display()
    );
    assert!(html.contains(&want), "{html}");
    assert!(out.join("config.yaml").exists());
    let df =
        ParquetReader::new(std::fs::File::open(out.join("main").join("trials.parquet")).unwrap());
    let df = df.finish().unwrap();
    // probpair: 2 pretraining × 2 trials × 2 splits.
    assert_eq!(df.height(), 8, "{df}");
    assert!(df.column("nmi_geometric").unwrap().f64().is_ok());
    assert!(df.column("pretrain").unwrap().bool().is_ok());
    assert!(df.column("trial").unwrap().i64().is_ok());
    let summary =
        ParquetReader::new(std::fs::File::open(out.join("main").join("table.parquet")).unwrap());
    let summary = summary.finish().unwrap();
    assert!(summary.column("mean").unwrap().f64().is_ok());
    assert!(summary.column("pretrain").unwrap().bool().is_ok());
}

#[test]
fn gc_dry_run_names_what_it_would_delete_and_set_keeps_override_results() {
    let env = Env::new();
    env.run_ok(&[]);
    env.run_ok(&["method=probpair", "--set", "train.epochs=4"]);
    let spec = env.spec();
    let dry = env.upcc(&["gc", &spec, "--grace-minutes", "0", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(dry.stdout.contains("would delete"), "{}", dry.stdout);
    assert!(
        dry.stdout
            .contains("  train/blobs/lv0.1/probpair/pre/t1  (key "),
        "{}",
        dry.stdout
    );
    let keep = env.upcc(&[
        "gc",
        &spec,
        "--set",
        "train.epochs=4",
        "--grace-minutes",
        "0",
        "--dry-run",
    ]);
    assert!(
        keep.stdout.starts_with("dry run: 0 results"),
        "{}",
        keep.stdout
    );
    // Within the grace, they are listed as kept for now.
    let recent = env.upcc(&["gc", &spec, "--dry-run"]);
    assert!(
        recent
            .stdout
            .contains("kept only because written in the last 60 minutes"),
        "{}",
        recent.stdout
    );
}
