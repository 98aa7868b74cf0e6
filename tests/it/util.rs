//! Shared helpers: a fresh temp directory per test with a small dataset and spec.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub struct Env {
    pub dir: tempfile::TempDir,
}

pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON object ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl std::fmt::Debug for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// 1-based line of the first occurrence of `needle` in `text`.
pub fn line_of(text: &str, needle: &str) -> usize {
    1 + text[..text.find(needle).expect("needle present")]
        .matches('\n')
        .count()
}

/// The paper's LaTeX source, `../shared/paper/eci-pp.tex` beside the repository: `None` (the
/// caller skips, saying so) where it is absent, unless `UPCC_TEST_PAPER` is set (CI sets it, as
/// CI always has `../shared`): then an absent or unreadable file fails the test instead of
/// letting it pass without comparing anything.
pub fn paper_tex() -> Option<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/paper/eci-pp.tex");
    match std::fs::read_to_string(&path) {
        Ok(tex) => Some(tex),
        Err(e) if std::env::var_os("UPCC_TEST_PAPER").is_some() => panic!(
            "UPCC_TEST_PAPER is set but the paper's source {} cannot be read: {e}",
            path.display()
        ),
        Err(_) => {
            eprintln!(
                "skipped the comparison with the paper's source: {} is absent (UPCC_TEST_PAPER=1 makes this a failure)",
                path.display()
            );
            None
        }
    }
}

pub fn upcc_bin() -> &'static str {
    env!("CARGO_BIN_EXE_upcc")
}

/// Gaussian blobs: `rows` samples, 8 features, 4 classes, written as CSV with a label column.
pub fn blobs_csv(rows: usize) -> String {
    let mut s = String::new();
    let mut state = 12345u64;
    let mut rnd = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 / (1u64 << 53) as f64) - 0.5
    };
    for i in 0..rows {
        let c = i % 4;
        // Overlapping classes, so that methods and trials give different results.
        let feats: Vec<String> = (0..8)
            .map(|j| format!("{:.4}", if j % 4 == c { 1.5 } else { 0.0 } + 3.0 * rnd()))
            .collect();
        s.push_str(&format!("{},{c}\n", feats.join(",")));
    }
    s
}

/// The smoke spec made small (`--set` overrides): the same datasets, supervision, methods,
/// targets and nodes, on smaller networks for fewer epochs and constraints. Its ProbPair and
/// ECI-PP cells still learn (test NMI about 0.2 on the CPU, where the full smoke cells reach
/// about 0.5; smaller networks, 32-32-128, collapse to one cluster: NMI 0 on every device).
/// The soft GPU trains the four cells of `tests/gpu/e2e.py` with it in about a minute and a
/// half, and the CPU the whole spec in seconds.
pub const SMOKE_SMALL: [&str; 24] = [
    "--set",
    "pretrain.hidden=[64,64,256]",
    "--set",
    "train.hidden=[64,64,256]",
    "--set",
    "expert.max_epochs=10",
    "--set",
    "pretrain.layerwise_epochs=5",
    "--set",
    "pretrain.finetune_epochs=10",
    "--set",
    "train.epochs=5",
    "--set",
    "methods.eci-pp.train.epochs=3",
    "--set",
    "methods.eci-pp.eci.warmup_epochs=1",
    "--set",
    "eci.folds=2",
    "--set",
    "eci.corrector_epochs=5",
    "--set",
    "constraints.budget=1000",
    "--set",
    "cluster.n_init=10",
];

pub const TINY_SPEC: &str = r#"
name: tiny
datasets:
  blobs:
    format: csv
    files: {data: blobs.csv}
    scaling: standardize
    split: {kind: stratified, test_fraction: 0.25, seed: 0}
    embedding_dim: 4
supervision:
  lv0.1: {kind: single, level: 0.1}
methods:
  probpair: {}
  weighted-probpair: {}
trials: [1, 2]
params:
  expert: {hidden: [16], max_epochs: 20}
  constraints: {budget: 300, corruption: 0.3, diagnostic_pairs: 50}
  pretrain: {hidden: [16, 16], layerwise_epochs: 2, finetune_epochs: 2}
  train: {hidden: [16, 16], epochs: 3}
  cluster: {n_init: 2}
targets:
  main:
    title: tiny
    grid:
      dataset: [blobs]
      supervision: [lv0.1]
      method: [probpair, weighted-probpair]
      pretrain: [true, false]
"#;

/// Nodes of TINY_SPEC: features, 1 expert (shared by the 2 trials), 2 constraints, 1 pretrain,
/// 8 × (train, cluster, metrics), 1 table.
pub const TINY_NODES: usize = 30;

impl Env {
    /// A temp dir with `blobs.csv` and `spec.yaml` (TINY_SPEC).
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("blobs.csv"), blobs_csv(240)).unwrap();
        std::fs::write(dir.path().join("spec.yaml"), TINY_SPEC).unwrap();
        Env { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn store(&self) -> PathBuf {
        self.path("store")
    }

    pub fn spec(&self) -> String {
        self.path("spec.yaml").display().to_string()
    }

    /// Run `upcc --store <store> args…` in the temp dir.
    pub fn upcc(&self, args: &[&str]) -> Ran {
        self.upcc_store(&self.store(), args)
    }

    pub fn upcc_store(&self, store: &Path, args: &[&str]) -> Ran {
        let out = self.command(store, args).output().expect("spawn upcc");
        ran(out)
    }

    pub fn command(&self, store: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(upcc_bin());
        c.current_dir(self.dir.path())
            .arg("--store")
            .arg(store)
            .args(args)
            .env("NO_COLOR", "1")
            .env("UPCC_THREADS", "2")
            .env_remove("RUST_LOG");
        c
    }

    /// `run --json` on the tiny spec with extra args; asserts success.
    pub fn run_ok(&self, extra: &[&str]) -> Value {
        let spec = self.spec();
        let mut args = vec!["run", spec.as_str(), "--json", "--progress", "none"];
        args.extend_from_slice(extra);
        let r = self.upcc(&args);
        assert_eq!(r.code, 0, "{r:?}");
        r.json()
    }

    /// Listing of the store's objects, manifests and refs (what "unchanged" means).
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for sub in ["objects", "nodes", "refs"] {
            let root = self.store().join(sub);
            let mut stack = vec![root.clone()];
            while let Some(d) = stack.pop() {
                let Ok(rd) = std::fs::read_dir(&d) else {
                    continue;
                };
                for e in rd.flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                        out.push((
                            p.strip_prefix(self.store()).unwrap().display().to_string(),
                            len,
                        ));
                    }
                }
            }
        }
        out.sort();
        out
    }
}

pub fn ran(out: Output) -> Ran {
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// Node ids with a given outcome in a `run --json` report, sorted.
pub fn ids_with(report: &Value, outcome: &str) -> Vec<String> {
    let mut v: Vec<String> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["outcome"] == outcome)
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Every node id of a spec, as `status --json` plans it.
pub fn planned_ids(env: &Env, spec: &str) -> Vec<String> {
    let s = env.upcc(&["status", spec, "--json"]).json();
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect()
}

/// (id, key) of every node of a report.
pub fn keys(report: &Value) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap().to_string(),
                n["key"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// The manifest of node `id` via `explain --json`.
pub fn manifest(env: &Env, spec: &str, id: &str, extra: &[&str]) -> Value {
    let mut args = vec!["explain", spec, id, "--json"];
    args.extend_from_slice(extra);
    let r = env.upcc(&args);
    assert_eq!(r.code, 0, "{r:?}");
    r.json()["manifest"].clone()
}

/// Path of a node's output object.
pub fn output_path(env: &Env, id: &str, output: &str) -> PathBuf {
    let m = manifest(env, &env.spec(), id, &[]);
    let digest = m["outputs"][output]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("{id} has no output {output}: {m}"))
        .to_string();
    env.store()
        .join("objects")
        .join(&digest[..2])
        .join(&digest[2..])
}
