//! Every parameter is checked when the spec loads, before anything runs: each problem names
//! its field and the valid range, at the spec line that holds it or the `--set` that gave it.

use crate::bad_input::{rejects, tiny_with};
use crate::util::*;

/// (parameter, value): each must be refused up front with a message naming it.
const BAD: &[(&str, &str, &str)] = &[
    ("cluster.n_init", "0", "must be at least 1"),
    ("cluster.max_iter", "0", "must be at least 1"),
    ("train.batch_size", "0", "must be at least 1"),
    ("train.lr", "-1", "learning rate > 0"),
    ("train.lr", ".inf", "learning rate > 0"),
    ("train.lr", "1e308", "≤ 10"),
    ("train.readout_lr", ".nan", "learning rate > 0"),
    ("train.hidden", "[16, 0]", "a layer of 0 units"),
    ("train.lambda_rec", "-5", "finite number ≥ 0"),
    ("train.grad_clip", "-1", "or null for no clipping"),
    ("train.grad_clip", "0", "or null for no clipping"),
    ("train.epochs", "0", "must be 1 to 100000 epochs"),
    ("train.epochs", "100001", "must be 1 to 100000 epochs"),
    ("train.readout_t0", "0", "finite number > 0"),
    ("expert.batch_size", "0", "must be at least 1"),
    ("expert.dropout", "1.5", "must be in [0, 1)"),
    ("expert.hidden", "[0]", "a layer of 0 units"),
    ("pretrain.corruption", "1.5", "must be in [0, 1)"),
    ("pretrain.lr", "0", "learning rate > 0"),
    ("constraints.corruption", "2", "must be in [0, 1]"),
    ("table.std_ddof", "3", "0 (population) or 1"),
    ("train.hidden", "[2000000000]", "of memory to train"),
];

#[test]
fn bad_parameters_are_refused_before_anything_runs_naming_the_set_argument() {
    for (key, value, needle) in BAD {
        let arg = format!("{key}={value}");
        let field = format!("`params.{key}");
        rejects(
            None,
            &[],
            &["--set", &arg],
            &[needle, &field, &format!("`--set {arg}`")],
        );
    }
}

#[test]
fn a_bad_value_in_the_file_is_placed_at_its_line() {
    let spec = tiny_with(
        "train: {hidden: [16, 16], epochs: 3}",
        "train: {hidden: [16, 16], epochs: 3, grad_clip: -1}",
    );
    let line = line_of(&spec, "grad_clip: -1");
    rejects(
        Some(&spec),
        &[],
        &[],
        &[
            &format!("bad.yaml:{line}"),
            "`params.train.grad_clip`",
            "or null for no clipping",
        ],
    );
    // A method's own override is placed at the method.
    let spec = tiny_with(
        "  weighted-probpair: {}",
        "  weighted-probpair: {train: {lr: -2}}",
    );
    let line = line_of(&spec, "lr: -2");
    rejects(
        Some(&spec),
        &[],
        &[],
        &[
            &format!("bad.yaml:{line}"),
            "`methods.weighted-probpair.train.lr`",
        ],
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&[
        "status",
        &spec,
        "--set",
        "cluster.n_init=0",
        "--set",
        "expert.dropout=2",
        "--set",
        "train.epochs=0",
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("has 3 problems"), "{r:?}");
    for f in [
        "params.cluster.n_init",
        "params.expert.dropout",
        "params.train.epochs",
    ] {
        assert!(r.stderr.contains(f), "{f}: {r:?}");
    }
}

#[test]
fn eci_settings_are_checked_against_the_method_and_the_training_settings() {
    let spec = TINY_SPEC
        .replacen("  weighted-probpair: {}\n", "  weighted-probpair: {}\n  eci-pp: {train: {epochs: 4}, eci: {warmup_epochs: 2, folds: 3, gamma: -1}}\n", 1)
        .replacen("method: [probpair, weighted-probpair]", "method: [probpair, eci-pp]", 1);
    rejects(
        Some(&spec),
        &[],
        &[],
        &["`methods.eci-pp.eci.gamma`", "finite number > 0"],
    );
    let spec = spec
        .replace("gamma: -1", "gamma: 10")
        .replace("warmup_epochs: 2", "warmup_epochs: 9");
    rejects(
        Some(&spec),
        &[],
        &[],
        &[
            "`methods.eci-pp.eci.warmup_epochs`",
            "exceeds `train.epochs` (4)",
        ],
    );
}

#[test]
fn absurd_sizes_are_refused_by_name_instead_of_aborting() {
    rejects(
        Some(&tiny_with("trials: [1, 2]", "trials: 100000000")),
        &[],
        &[],
        &["`trials: 100000000`"],
    );
    rejects(
        Some(&tiny_with("embedding_dim: 4", "embedding_dim: 1000000000")),
        &[],
        &[],
        &["embedding_dim: 1000000000", "at most 100000"],
    );
}

#[test]
fn structural_mistakes_are_told_in_the_users_words() {
    // A list of seeds or a number: not serde's "untagged enum".
    rejects(
        Some(&tiny_with("trials: [1, 2]", "trials: abc")),
        &[],
        &[],
        &[
            "`trials` must be a number of trials or a list of seeds",
            "`abc`",
        ],
    );
    // A duplicate key at its second occurrence, not at 1:1.
    let spec = format!("{TINY_SPEC}\ntrials: 3\n");
    let second = spec.lines().count();
    rejects(
        Some(&spec),
        &[],
        &[],
        &[
            &format!("bad.yaml:{second}"),
            "duplicate",
            "also defined at line",
        ],
    );
    // A top-level list: what a spec is.
    rejects(
        Some("- a\n- b\n"),
        &[],
        &[],
        &["a spec is a mapping", "list"],
    );
    // An integer too large for any field.
    rejects(
        Some(&tiny_with("epochs: 3", "epochs: 99999999999999999999999")),
        &[],
        &[],
        &["far too large"],
    );
}

#[test]
fn a_figure_needs_diagnostic_pairs_and_expert_supervision() {
    let spec = TINY_SPEC
        .replacen("  weighted-probpair: {}\n", "  weighted-probpair: {}\n  eci-pp: {train: {epochs: 2}, eci: {warmup_epochs: 1}}\n", 1)
        .replacen("diagnostic_pairs: 50", "diagnostic_pairs: 0", 1)
        + "  fig:\n    kind: figure\n    grid: {dataset: [blobs], supervision: [lv0.1], method: [eci-pp], pretrain: [false]}\n";
    rejects(
        Some(&spec),
        &[],
        &[],
        &["`params.constraints.diagnostic_pairs` is 0", "fig"],
    );
}

#[test]
fn an_empty_selector_value_is_an_error() {
    let env = Env::new();
    let spec = env.spec();
    let r = env.upcc(&["status", &spec, "method="]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("`method=` names no value"), "{r:?}");
}

#[test]
fn oracle_settings_and_oracle_panels_are_checked_before_anything_runs() {
    let eci = TINY_SPEC.replacen(
        "  weighted-probpair: {}\n",
        "  weighted-probpair: {}\n  eci-pp: {train: {epochs: 2}, eci: {warmup_epochs: 1}}\n",
        1,
    );
    let figure = "  fig:\n    kind: figure\n    grid: {dataset: [blobs], supervision: [lv0.1], method: [eci-pp], pretrain: [false]}\n";
    // `oracle_panels` belongs to figures.
    rejects(
        Some(&(eci.clone() + "    oracle_panels: run\n")),
        &[],
        &[],
        &[
            "`oracle_panels` chooses where a figure's panels G and H come from",
            "kind `table`",
        ],
    );
    // An unknown reading names the valid ones.
    rejects(
        Some(&(eci.clone() + figure + "    oracle_panels: rerun\n")),
        &[],
        &[],
        &["oracle_panels", "relabel"],
    );
    // The derived oracle run's name must be free.
    let taken = eci.replacen(
        "  lv0.1: {kind: single, level: 0.1}\n",
        "  lv0.1: {kind: single, level: 0.1}\n  lv0.1.oracle: {kind: oracle}\n",
        1,
    ) + figure;
    rejects(
        Some(&taken),
        &[],
        &[],
        &["`lv0.1.oracle`", "oracle_panels: relabel"],
    );
    // No experts behind oracle judgments: no experts table, and a sane number of ids.
    let oracle = TINY_SPEC.replacen(
        "  lv0.1: {kind: single, level: 0.1}\n",
        "  lv0.1: {kind: single, level: 0.1}\n  truth: {kind: oracle, experts: 0}\n",
        1,
    )
        + "  ex:\n    kind: experts\n    grid: {dataset: [blobs], supervision: [truth]}\n";
    rejects(
        Some(&oracle),
        &[],
        &[],
        &[
            "`experts` (nominal expert ids of the oracle judgments) must be in 1..=10000",
            "is the oracle's and has no trained experts",
        ],
    );
}

#[test]
fn a_dataset_that_is_not_the_papers_is_refused_with_each_difference() {
    let env = Env::new();
    // blobs: 240 rows, a quarter for testing, 8 features, 4 classes.
    let ok = TINY_SPEC.replacen(
        "    embedding_dim: 4\n",
        "    embedding_dim: 4\n    expect: {train: 180, test: 60, dim: 8, classes: 4}\n",
        1,
    );
    env.write("spec.yaml", &ok);
    env.run_ok(&["stage=features"]);
    let bad = TINY_SPEC.replacen(
        "    embedding_dim: 4\n",
        "    embedding_dim: 4\n    expect: {train: 60000, test: 60, dim: 784}\n",
        1,
    );
    env.write("spec.yaml", &bad);
    let spec = env.spec();
    let r = env.upcc(&["run", &spec, "stage=features", "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("dataset `blobs` is not the paper's: 180 training rows, the paper's dataset has 60000; 8 features, the paper's dataset has 784"),
        "{r:?}"
    );
    // An unknown field is a spec error.
    env.write(
        "spec.yaml",
        &TINY_SPEC.replacen(
            "    embedding_dim: 4\n",
            "    embedding_dim: 4\n    expect: {rows: 3}\n",
            1,
        ),
    );
    let r = env.upcc(&["status", &spec]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("rows"), "{r:?}");
}
