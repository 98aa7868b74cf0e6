//! Every compared method end to end on the tiny dataset: VanillaDCC, VolMaxDCC with its λ
//! search, CIDEC, soft SpherePair, ProbPair, Weighted ProbPair, ECI-PP and the expert-aware
//! ensembles with their α search; selections as nodes with early cutoff.

use crate::util::*;

pub const ALL_METHODS: &str = r#"
name: methods
datasets:
  blobs:
    format: csv
    files: {data: blobs.csv}
    scaling: standardize
    split: {kind: stratified, test_fraction: 0.25, seed: 0}
    embedding_dim: 4
    validation: 30
supervision:
  lv0.1: {kind: single, level: 0.1}
  multi2: {kind: multi, experts: 2}
methods:
  vanilla-dcc: {}
  volmax-dcc: {}
  cidec: {}
  spherepair: {}
  probpair: {}
  weighted-probpair: {}
  eci-pp: {train: {epochs: 4}, eci: {warmup_epochs: 2, folds: 3}}
  sp-ea: {}
  wpp-ea: {}
trials: [1, 2]
params:
  expert: {hidden: [16], max_epochs: 20}
  constraints: {budget: 300, corruption: 0.3, diagnostic_pairs: 50}
  pretrain: {hidden: [16, 16], layerwise_epochs: 2, finetune_epochs: 2}
  train: {hidden: [16, 16], epochs: 3}
  dcc: {hidden: [16], epochs: 5}
  volmax: {hidden: [16], epochs: 5, lambdas: [0, 0.01], search_runs: 2, volume_rows: 50}
  cidec: {hidden: [16, 16], epochs: 5}
  spherepair: {hidden: [16, 16], epochs: 3}
  ensemble: {alphas: [0.1, 1.0], search_runs: 2}
  cluster: {n_init: 2}
targets:
  pretrained:
    grid: {dataset: [blobs], supervision: [multi2], method: [cidec, spherepair, probpair, weighted-probpair, eci-pp, sp-ea, wpp-ea], pretrain: [true]}
    columns: [method]
  dcc:
    grid: {dataset: [blobs], supervision: [lv0.1, multi2], method: [vanilla-dcc, volmax-dcc], pretrain: [false]}
    columns: [method]
  main:
    title: "Without a pretrain axis: each method as the paper's main table runs it"
    grid: {dataset: [blobs], supervision: [multi2], method: [vanilla-dcc, cidec, probpair]}
  lambda:
    kind: selection
    grid: {dataset: [blobs], supervision: [lv0.1, multi2], method: [volmax-dcc]}
  alpha:
    kind: selection
    grid: {dataset: [blobs], supervision: [multi2], method: [sp-ea, wpp-ea]}
    columns: [method]
"#;

fn setup() -> (Env, serde_json::Value) {
    let env = Env::new();
    env.write("spec.yaml", ALL_METHODS);
    let r = env.run_ok(&[]);
    (env, r)
}

#[test]
fn every_method_runs_end_to_end_and_fills_its_cells() {
    let (env, r) = setup();
    assert_eq!(r["failed"], 0, "{r}");
    for (t, methods) in [
        (
            "pretrained",
            &[
                "cidec",
                "spherepair",
                "probpair",
                "weighted-probpair",
                "eci-pp",
                "sp-ea",
                "wpp-ea",
            ][..],
        ),
        ("dcc", &["vanilla-dcc", "volmax-dcc"][..]),
    ] {
        let table = r["tables"][t].as_str().unwrap();
        assert!(!table.contains("— / —"), "every cell has a result: {table}");
        for m in methods {
            assert!(table.contains(m), "{m} in {table}");
        }
    }
    // The selections are nodes; their chosen values are in the manifests.
    let spec = env.spec();
    let ids = planned_ids(&env, &spec);
    let ids: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
    for id in [
        "select/volmax-dcc/blobs/lv0.1/nopre",
        "select/volmax-dcc/blobs/multi2/nopre",
        "select/sp-ea/blobs/multi2/pre",
        "select/wpp-ea/blobs/multi2/pre",
    ] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    let m = manifest(&env, &spec, "select/volmax-dcc/blobs/lv0.1/nopre", &[]);
    let lambda = m["summary"]["lambda"].as_f64().unwrap();
    assert!(lambda == 0.0 || lambda == 0.01, "{m}");
    // The selection tables show the chosen values, one per cell.
    let shown = if lambda == 0.0 {
        "| blobs | volmax-dcc | 0 ("
    } else {
        "| blobs | volmax-dcc | 1e-2 ("
    };
    let table = r["tables"]["lambda"].as_str().unwrap();
    assert!(
        table.contains("| dataset | method | lv0.1 | multi2 |"),
        "{table}"
    );
    assert!(table.contains(shown), "{table}\n{m}");
    assert!(!table.contains("| —"), "{table}");
    let table = r["tables"]["alpha"].as_str().unwrap();
    assert!(
        table.contains("| dataset | supervision | sp-ea | wpp-ea |"),
        "{table}"
    );
    assert!(!table.contains("| —"), "{table}");
    // Without a pretrain axis, VanillaDCC runs unpretrained next to pretrained methods in
    // one row, and the table has no pretrain column.
    let table = r["tables"]["main"].as_str().unwrap();
    assert!(
        table.contains("| dataset | supervision | metric | vanilla-dcc | cidec | probpair |"),
        "{table}"
    );
    assert!(!table.contains("— / —"), "{table}");
    assert!(ids.contains(&"cidec/blobs/multi2/cidec/pre/t1"), "{ids:?}");
    // Search runs are labelled by their parameter value and train without the validation
    // rows (`blobs@val`); the final runs and the other methods use every training row.
    assert!(
        ids.contains(&"dcc/blobs@val/lv0.1/volmax-dcc@lambda=0.01/nopre/t2"),
        "{ids:?}"
    );
    assert!(ids.contains(&"features/blobs@val"), "{ids:?}");
    assert!(ids.contains(&"constraints/blobs@val/multi2/t1"), "{ids:?}");
    assert!(ids.contains(&"pretrain/blobs@val/s0"), "{ids:?}");
    assert!(
        ids.contains(&"train/blobs/multi2/probpair/pre/t1"),
        "{ids:?}"
    );
    let final_run = manifest(&env, &spec, "dcc/blobs/lv0.1/volmax-dcc/nopre/t1", &[]);
    let search_run = manifest(
        &env,
        &spec,
        "dcc/blobs@val/lv0.1/volmax-dcc@lambda=0.0/nopre/t1",
        &[],
    );
    assert_ne!(
        final_run["material"]["inputs"]["features"], search_run["material"]["inputs"]["features"],
        "searches and final runs read different features"
    );
    assert!(
        ids.contains(&"train/blobs/multi2/sp-ea/pre/t1/e1"),
        "{ids:?}"
    );
    assert!(
        ids.contains(&"ensemble/blobs/multi2/wpp-ea/pre/t2"),
        "{ids:?}"
    );
}

#[test]
fn a_selection_that_chooses_the_same_value_again_keeps_the_final_training_fresh() {
    let (env, _) = setup();
    // The same grid in another order: the selection reruns, chooses the same λ, and the final
    // VolMaxDCC trainings stay fresh (early cutoff on the chosen value).
    let r = env.run_ok(&["--set", "volmax.lambdas=[0.01, 0]"]);
    let executed = ids_with(&r, "executed");
    assert!(
        executed.iter().any(|i| i.starts_with("select/volmax-dcc")),
        "{executed:?}"
    );
    assert!(
        !executed
            .iter()
            .any(|i| i.starts_with("dcc/blobs/lv0.1/volmax-dcc/")),
        "the final trainings rerun: {executed:?}"
    );
}

#[test]
fn methods_are_checked_against_their_needs_before_anything_runs() {
    let env = Env::new();
    // A λ search without validation rows.
    env.write("a.yaml", &ALL_METHODS.replace("    validation: 30\n", ""));
    let spec = env.path("a.yaml").display().to_string();
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("reserves no validation rows") && r.stderr.contains("volmax-dcc"),
        "{r:?}"
    );
    // An expert-aware ensemble under a single expert.
    env.write(
        "b.yaml",
        &ALL_METHODS.replace(
            "supervision: [multi2], method: [cidec",
            "supervision: [lv0.1], method: [cidec",
        ),
    );
    let spec = env.path("b.yaml").display().to_string();
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains("needs a multi-expert supervision setting"),
        "{r:?}"
    );
    // Pretraining a method without an autoencoder.
    env.write(
        "c.yaml",
        &ALL_METHODS.replace(
            "method: [vanilla-dcc, volmax-dcc], pretrain: [false]",
            "method: [vanilla-dcc, volmax-dcc], pretrain: [true]",
        ),
    );
    let spec = env.path("c.yaml").display().to_string();
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("has no pretraining"), "{r:?}");
    // A section a method does not read, and bad values in a method's section.
    env.write(
        "d.yaml",
        &ALL_METHODS.replace(
            "  cidec: {}\n",
            "  cidec: {cidec: {alpha: -1}, train: {epochs: 2}}\n",
        ),
    );
    let spec = env.path("d.yaml").display().to_string();
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("sets `train`, which it does not read"),
        "{r:?}"
    );
    // A selection table of a method without a search, and a pretrain column without the axis.
    env.write(
        "e.yaml",
        &ALL_METHODS
            .replace("method: [sp-ea, wpp-ea]", "method: [sp-ea, probpair]")
            .replace(
                "method: [vanilla-dcc, cidec, probpair]}",
                "method: [vanilla-dcc, cidec, probpair]}\n    columns: [method, pretrain]",
            ),
    );
    let spec = env.path("e.yaml").display().to_string();
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("(kind: selection)") && r.stderr.contains("`probpair`"),
        "{r:?}"
    );
    assert!(r.stderr.contains("add `pretrain: [true, false]`"), "{r:?}");
}

#[test]
fn validation_scope_all_holds_the_rows_out_of_every_training() {
    let env = Env::new();
    env.write(
        "spec.yaml",
        &ALL_METHODS.replace(
            "    validation: 30\n",
            "    validation: 30\n    validation_scope: all\n",
        ),
    );
    let spec = env.spec();
    let ids = planned_ids(&env, &spec);
    let ids: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
    assert!(!ids.iter().any(|i| i.contains("@val")), "{ids:?}");
    assert!(
        ids.contains(&"dcc/blobs/lv0.1/volmax-dcc@lambda=0.01/nopre/t2"),
        "{ids:?}"
    );
    // One features node, with the validation rows in its key.
    let f = env
        .upcc(&["explain", &spec, "features/blobs", "--json"])
        .json();
    assert_eq!(f["params"]["validation"], 30, "{f}");
}

/// Tables 7-9 and the robustness figures at other budgets and corruptions: the spec's main
/// setting is 300 constraints at π = 0.3.
const SWEEP_TARGET: &str = r#"
  sweep:
    grid: {dataset: [blobs], supervision: [lv0.1, multi2], method: [volmax-dcc], budget: [150, 300], corruption: [0.3, 0.5], pretrain: [false]}
  sweep_ea:
    grid: {dataset: [blobs], supervision: [multi2], method: [sp-ea], budget: [150, 300], corruption: [0.3, 0.5], pretrain: [false]}
"#;

/// The `select` nodes a spec plans, and every node id of its search runs.
fn planned_searches(env: &Env, extra: &[&str]) -> (Vec<String>, Vec<String>) {
    let spec = env.spec();
    let mut args = vec!["status", spec.as_str(), "--json"];
    args.extend(extra);
    let r = env.upcc(&args);
    assert_eq!(r.code, 0, "{r:?}");
    let ids: Vec<String> = r.json()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    // The sweep targets' searches (the other targets pretrain their ensembles).
    let mut select: Vec<String> = ids
        .iter()
        .filter(|i| i.starts_with("select/") && i.ends_with("/nopre"))
        .cloned()
        .collect();
    select.sort();
    let search = ids
        .iter()
        .filter(|i| i.contains("@val/") && i.contains("/nopre/"))
        .cloned()
        .collect();
    (select, search)
}

#[test]
fn a_search_runs_once_per_setting_at_the_main_setting_and_per_cell_on_request() {
    let env = Env::new();
    env.write("spec.yaml", &format!("{ALL_METHODS}{SWEEP_TARGET}"));
    let (select, search) = planned_searches(&env, &[]);
    // One λ per supervision setting (the spec has no multi3 for multi2 to share) and one α for
    // the multi-expert setting, whatever the budget and corruption of the cell: the
    // 150-constraint and π = 0.5 cells reuse the main setting's.
    assert_eq!(
        select,
        vec![
            "select/sp-ea/blobs/multi2/pi0.3/n300/nopre".to_string(),
            "select/volmax-dcc/blobs/lv0.1/pi0.3/n300/nopre".to_string(),
            "select/volmax-dcc/blobs/multi2/pi0.3/n300/nopre".to_string(),
        ],
        "{select:?}"
    );
    assert!(
        search.iter().all(|i| i.contains("/pi0.3/n300/")),
        "every search run at the main setting: {search:?}"
    );
    let r = env.upcc(&[
        "explain",
        &env.spec(),
        "dcc/blobs/lv0.1/pi0.5/n150/volmax-dcc/nopre/t1",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let inputs = r.json()["inputs"].to_string();
    assert!(
        inputs.contains("select/volmax-dcc/blobs/lv0.1/pi0.3/n300/nopre"),
        "the π = 0.5, 150-constraint cell trains with the main setting's λ: {inputs}"
    );
    // `search_scope: cell` searches again in every cell (the other reading).
    let (select, search) = planned_searches(
        &env,
        &[
            "--set",
            "volmax.search_scope=cell",
            "--set",
            "ensemble.search_scope=cell",
        ],
    );
    assert_eq!(select.len(), 3 * 4, "{select:?}");
    for cell in ["pi0.5/n150", "pi0.3/n150", "pi0.5/n300", "pi0.3/n300"] {
        assert!(
            select.iter().any(|s| s.contains(cell)),
            "{cell}: {select:?}"
        );
        assert!(search.iter().any(|s| s.contains(cell)), "{cell}");
    }
}

/// Four classes on two informative features and one nuisance feature that splits the rows
/// into two far-apart clumps unrelated to the class: after standardising, k-means on the raw
/// features follows the clumps (ACC 0.5), while pairwise supervision says which directions
/// matter.
fn clumped_blobs(rows: usize) -> (String, Vec<Vec<f64>>, Vec<usize>) {
    let mut state = 777u64;
    let mut unif = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut gauss = move || {
        let (u, v) = (unif().max(1e-12), unif());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    };
    let (mut csv, mut x, mut y) = (String::new(), Vec::new(), Vec::new());
    for i in 0..rows {
        let c = i % 4;
        let clump = if (i / 4) % 2 == 0 { 3.0 } else { -3.0 };
        let row = vec![
            if c % 2 == 0 { 1.5 } else { -1.5 } + 0.5 * gauss(),
            if c / 2 == 0 { 1.5 } else { -1.5 } + 0.5 * gauss(),
            clump + 0.3 * gauss(),
        ];
        let fields: Vec<String> = row.iter().map(|v| format!("{v:.4}")).collect();
        csv.push_str(&format!("{},{c}\n", fields.join(",")));
        x.push(row);
        y.push(c);
    }
    (csv, x, y)
}

/// ACC of the project's own k-means (10 k-means++ starts, 4 clusters) on the standardised `x`
/// (as the spec's `scaling: standardize` gives the methods): the baseline.
fn raw_kmeans_acc(x: &[Vec<f64>], y: &[usize]) -> f64 {
    use upcc_stages::{cluster, metrics};
    let (d, n) = (x[0].len(), x.len() as f64);
    let mean: Vec<f64> = (0..d)
        .map(|j| x.iter().map(|r| r[j]).sum::<f64>() / n)
        .collect();
    let sd: Vec<f64> = (0..d)
        .map(|j| (x.iter().map(|r| (r[j] - mean[j]).powi(2)).sum::<f64>() / n).sqrt())
        .collect();
    let z: Vec<f32> = x
        .iter()
        .flat_map(|r| {
            (0..d)
                .map(|j| ((r[j] - mean[j]) / sd[j]) as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    let params = cluster::ClusterParams {
        settings: cluster::ClusterSettings {
            n_init: 10,
            ..Default::default()
        },
        k: 4,
        seed: 0,
    };
    let km = cluster::kmeans(&z, d, 4, &params).unwrap();
    let truth: Vec<u32> = y.iter().map(|&c| c as u32).collect();
    metrics::accuracy(&truth, &km.labels)
}

/// Every method on the clumped blobs with two accurate experts and clean constraints, trained
/// long enough to learn (ALL_METHODS's settings only check that each method runs). Measured
/// settings: with DCC's assignment-change stop at its default 10 epochs, VolMaxDCC at Adam
/// 0.005, ECI-PP with 2 warm-up epochs, or CIDEC's λ₂ at the paper's 0.1 (its clusters start
/// from k-means on the autoencoder's code, which follows the clumps, and the weak pairwise term
/// does not pull them off: ACC 0.51; λ₂ 0.3 gives 0.99, 1.0 gives 1.00), those methods stop or
/// settle near ACC 0.5 here.
const QUALITY_SPEC: &str = r#"
name: quality
datasets:
  clumps:
    format: csv
    files: {data: clumps.csv}
    scaling: standardize
    split: {kind: stratified, test_fraction: 0.1, seed: 0}
    embedding_dim: 4
    validation: 30
supervision:
  good: {kind: multi, experts: 2, familiar: 0.9, unfamiliar: 0.9}
methods:
  vanilla-dcc: {}
  volmax-dcc: {}
  cidec: {}
  spherepair: {}
  probpair: {}
  weighted-probpair: {}
  eci-pp: {eci: {warmup_epochs: 20}}
  sp-ea: {}
  wpp-ea: {}
trials: [1]
params:
  expert: {hidden: [32], max_epochs: 300, lr: 0.01, patience: 50}
  constraints: {budget: 2000, corruption: 0.0, diagnostic_pairs: 50}
  pretrain: {hidden: [32, 32], layerwise_epochs: 10, finetune_epochs: 20}
  train: {hidden: [32, 32], epochs: 100, batch_size: 64, lr: 0.005}
  dcc: {hidden: [32], epochs: 100, batch_size: 64, lr: 0.005, stop: {min_epochs: 50}}
  volmax: {hidden: [32], epochs: 100, batch_size: 64, lr: 0.01, stop: {min_epochs: 50}, lambdas: [0, 0.01], search_runs: 2, volume_rows: 50}
  cidec: {hidden: [32, 32], epochs: 100, batch_size: 64, lr: 0.005, lambda_mcl: 1.0}
  spherepair: {hidden: [32, 32], epochs: 100, batch_size: 64, lr: 0.005}
  ensemble: {alphas: [0.1, 1.0], search_runs: 2}
  cluster: {n_init: 5}
targets:
  pretrained:
    grid: {dataset: [clumps], supervision: [good], method: [cidec, spherepair, probpair, weighted-probpair, eci-pp, sp-ea, wpp-ea], pretrain: [true]}
    columns: [method]
  dcc:
    grid: {dataset: [clumps], supervision: [good], method: [vanilla-dcc, volmax-dcc], pretrain: [false]}
    columns: [method]
"#;

/// A method that learns nothing from the supervision (constant or random assignments, or
/// plain k-means on its own features) fails this: each must beat k-means on the raw features
/// by 35 points of ACC on the training rows (each reaches 0.99 or more; DCC stopped after one
/// epoch reaches 0.68 and fails).
#[test]
fn every_method_beats_k_means_on_the_raw_features() {
    let (csv, x, y) = clumped_blobs(400);
    let baseline = raw_kmeans_acc(&x, &y);
    assert!(
        baseline < 0.6,
        "the data must fool raw k-means: ACC {baseline}"
    );
    let env = Env::new();
    std::fs::write(env.path("clumps.csv"), csv).unwrap();
    env.write("spec.yaml", QUALITY_SPEC);
    env.run_ok(&[]);
    let out = env.path("report");
    let spec = env.spec();
    let rep = env.upcc(&["report", &spec, "--out", &out.display().to_string()]);
    assert_eq!(rep.code, 0, "{rep:?}");
    let mut scored = Vec::new();
    for target in ["pretrained", "dcc"] {
        let table = std::fs::read_to_string(out.join(target).join("table.csv")).unwrap();
        let header: Vec<&str> = table.lines().next().unwrap().split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (method, split, metric, mean) =
            (col("method"), col("split"), col("metric"), col("mean"));
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            if f[split] != "train" || f[metric] != "ACC" {
                continue;
            }
            // Percent, as the tables print it.
            let acc: f64 = f[mean].parse::<f64>().unwrap() / 100.0;
            assert!(
                acc > baseline + 0.35,
                "{} (ACC {acc:.3}) does not beat k-means on the raw features (ACC {baseline:.3})",
                f[method]
            );
            scored.push((f[method].to_string(), acc));
        }
    }
    assert_eq!(scored.len(), 9, "every method is scored once: {scored:?}");
}
