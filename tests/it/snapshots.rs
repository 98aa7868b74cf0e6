//! Snapshots of what a researcher reads: `status` after a change, `explain` of a stale node,
//! and the error report of a spec with several problems. A change to any of them shows as a
//! diff of the file in `tests/it/snapshots/` (review with `cargo insta review`, or rerun with
//! `INSTA_UPDATE=always` and read `git diff`). What differs between machines and runs is
//! replaced by a placeholder: keys (training keys name the CPU's numerics class), the class
//! itself, and the time estimate.

use crate::util::*;

/// The filters every snapshot here shares.
fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    s.add_filter(r"\b[0-9a-f]{64}\b", "[key]");
    s.add_filter(r"cpu-f32-(avx512|fma|neon|scalar)", "cpu-f32-[isa]");
    s.add_filter(
        r"(?m)^          (avx512|fma|neon|scalar): .*$",
        "          [isa]: [what the instruction set means]",
    );
    s.add_filter(
        r"estimated \S+ \S+ of node time",
        "estimated [time] of node time",
    );
    s
}

/// `run` one cell of the tiny spec on the CPU, then change the training epochs.
fn ran_one_cell() -> Env {
    let env = Env::new();
    let r = env.upcc(&[
        "--device",
        "cpu",
        "run",
        "spec.yaml",
        "method=probpair",
        "trial=1",
        "pretrain=false",
        "--progress",
        "none",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    env
}

#[test]
fn status_after_a_change_says_what_is_fresh_stale_and_missing_and_why() {
    let env = ran_one_cell();
    let r = env.upcc(&[
        "--device",
        "cpu",
        "status",
        "spec.yaml",
        "method=probpair",
        "trial=1",
        "--set",
        "train.epochs=4",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stderr, "", "{r:?}");
    settings().bind(|| insta::assert_snapshot!("status_after_a_change", r.stdout));
}

#[test]
fn explain_of_a_stale_node_shows_its_key_material_and_why() {
    let env = ran_one_cell();
    let r = env.upcc(&[
        "--device",
        "cpu",
        "explain",
        "spec.yaml",
        "train/blobs/lv0.1/probpair/nopre/t1",
        "--set",
        "train.epochs=4",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    settings().bind(|| insta::assert_snapshot!("explain_stale_train_node", r.stdout));
}

#[test]
fn a_spec_with_several_problems_gets_one_report_naming_each_line() {
    let env = Env::new();
    env.write(
        "bad.yaml",
        "name: x\n\
         datasets:\n  blobs: {format: csv, files: {data: blobz.csv}}\n\
         supervision: {lv: {kind: single, level: 1.5}}\n\
         methods: {probpair: {train: {epochs: -1}}, nope: {}}\n\
         trials: [1]\n\
         targets: {t: {grid: {dataset: [blobs], supervision: [lv], method: [probpair]}}}\n",
    );
    let r = env.upcc(&["--device", "cpu", "run", "bad.yaml"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(r.stdout, "", "{r:?}");
    assert!(
        !env.store().exists(),
        "nothing written before the spec is valid"
    );
    settings().bind(|| insta::assert_snapshot!("error_several_problems", r.stderr));
    // One unknown field, with the hint.
    env.write(
        "typo.yaml",
        "name: x\ndatasets:\n  blobs: {format: csv, files: {data: blobs.csv}, scalng: standardize}\n",
    );
    let r = env.upcc(&["--device", "cpu", "run", "typo.yaml"]);
    assert_eq!(r.code, 2, "{r:?}");
    settings().bind(|| insta::assert_snapshot!("error_unknown_field", r.stderr));
}
