//! Bad input: a clear message naming the file/field and the fix, exit code 2, and the store
//! left exactly as it was.

use crate::util::*;

/// Populate the store with a good run, then run `args` against `spec_text` and check the
/// message, the exit code and that the store is unchanged.
pub fn rejects(
    spec_text: Option<&str>,
    extra_files: &[(&str, &[u8])],
    args: &[&str],
    needles: &[&str],
) {
    let env = Env::new();
    env.run_ok(&[]);
    let before = env.snapshot();
    if let Some(t) = spec_text {
        env.write("bad.yaml", t);
    }
    for (name, bytes) in extra_files {
        std::fs::write(env.path(name), bytes).unwrap();
    }
    let spec = if spec_text.is_some() {
        env.path("bad.yaml").display().to_string()
    } else {
        env.spec()
    };
    let mut full: Vec<&str> = vec!["run", &spec, "--progress", "none"];
    full.extend_from_slice(args);
    let r = env.upcc(&full);
    assert_eq!(r.code, 2, "expected exit 2 (bad input): {r:?}");
    for n in needles {
        assert!(r.stderr.contains(n), "stderr lacks `{n}`: {r:?}");
    }
    assert_eq!(env.snapshot(), before, "the store changed: {r:?}");
    let tmp = std::fs::read_dir(env.store().join("tmp")).unwrap().count();
    assert_eq!(tmp, 0, "temporary files left behind");
}

pub fn tiny_with(from: &str, to: &str) -> String {
    assert!(TINY_SPEC.contains(from), "fixture lacks `{from}`");
    TINY_SPEC.replacen(from, to, 1)
}

#[test]
fn yaml_syntax_error_points_at_the_line() {
    rejects(
        Some(&tiny_with("trials: [1, 2]", "trials: [1, 2")),
        &[],
        &[],
        &["bad.yaml:", "error:"],
    );
}

#[test]
fn unknown_top_level_key_suggests_the_nearest() {
    let line = format!("bad.yaml:{}", line_of(TINY_SPEC, "datasets:"));
    rejects(
        Some(&tiny_with("datasets:", "datsets:")),
        &[],
        &[],
        &["unknown field `datsets`", "did you mean `datasets`?", &line],
    );
}

#[test]
fn unknown_parameter_suggests_the_nearest() {
    let line = format!("bad.yaml:{}", line_of(TINY_SPEC, "corruption: 0.3"));
    rejects(
        Some(&tiny_with("corruption: 0.3", "corruptoin: 0.3")),
        &[],
        &[],
        &[
            "unknown field `corruptoin`",
            "did you mean `corruption`?",
            &line,
        ],
    );
}

#[test]
fn unknown_method_in_a_grid_names_line_and_candidates() {
    let line = format!("bad.yaml:{}", line_of(TINY_SPEC, "method: [probpair,"));
    rejects(
        Some(&tiny_with("method: [probpair,", "method: [probpar,")),
        &[],
        &[],
        &[
            "unknown method `probpar`",
            "did you mean `probpair`?",
            &line,
        ],
    );
}

#[test]
fn unknown_dataset_in_a_grid() {
    rejects(
        Some(&tiny_with("dataset: [blobs]", "dataset: [blob]")),
        &[],
        &[],
        &["unknown dataset `blob`", "did you mean `blobs`?"],
    );
}

#[test]
fn wrong_type_is_reported_with_its_location() {
    rejects(
        Some(&tiny_with("budget: 300", "budget: lots")),
        &[],
        &[],
        &["invalid type", "bad.yaml:"],
    );
}

#[test]
fn unknown_scaling_variant() {
    rejects(
        Some(&tiny_with("scaling: standardize", "scaling: standardise")),
        &[],
        &[],
        &["standardise", "standardize"],
    );
}

#[test]
fn missing_dataset_file_is_named() {
    rejects(
        Some(&tiny_with("data: blobs.csv", "data: nope.csv")),
        &[],
        &[],
        &["file `nope.csv`", "not found"],
    );
}

#[test]
fn missing_spec_file() {
    let env = Env::new();
    let r = env.upcc(&["run", "does-not-exist.yaml"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains("spec file `does-not-exist.yaml` not found"),
        "{r:?}"
    );
}

#[test]
fn ragged_rows_name_the_line() {
    let mut csv = blobs_csv(240);
    csv.push_str("1,2,3\n");
    rejects(
        Some(&tiny_with("data: blobs.csv", "data: ragged.csv")),
        &[("ragged.csv", csv.as_bytes())],
        &[],
        &["ragged.csv` line 241", "ragged rows"],
    );
}

#[test]
fn nan_values_name_line_and_column() {
    let csv = blobs_csv(240)
        .replacen("\n", "\nnan,", 1)
        .replacen(",0.", ",", 0);
    // Row 2 now starts with an extra `nan` field: fix the row to the right width.
    let mut lines: Vec<String> = csv.lines().map(|l| l.to_string()).collect();
    let fields: Vec<&str> = lines[1].split(',').collect();
    lines[1] = fields[..fields.len() - 2]
        .iter()
        .chain([fields[fields.len() - 1]].iter())
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    let text = lines.join("\n") + "\n";
    rejects(
        Some(&tiny_with("data: blobs.csv", "data: nan.csv")),
        &[("nan.csv", text.as_bytes())],
        &[],
        &["nan.csv` line 2, column 1", "not finite"],
    );
}

#[test]
fn label_outside_the_declared_range() {
    let spec = tiny_with("embedding_dim: 4", "embedding_dim: 4\n    n_classes: 3");
    rejects(
        Some(&spec),
        &[],
        &[],
        &["label 3", "outside 0..3", "n_classes"],
    );
}

#[test]
fn constraint_values_outside_unit_interval() {
    let spec = tiny_with(
        "lv0.1: {kind: single, level: 0.1}",
        "mine: {kind: file, path: cons.csv}",
    )
    .replace("supervision: [lv0.1]", "supervision: [mine]");
    let cons = "a,b,y\n0,1,0.5\n2,3,1.5\n";
    // Rows 0..3 must be training rows; the stratified split keeps most rows in train, but be
    // safe: the message must be about the value whatever the split.
    let r_needles = ["outside [0, 1]"];
    let env = Env::new();
    env.run_ok(&[]);
    let before = env.snapshot();
    env.write("bad.yaml", &spec);
    std::fs::write(env.path("cons.csv"), cons).unwrap();
    let bad = env.path("bad.yaml").display().to_string();
    // Find two training rows for the good line and the bad line.
    let r = env.upcc(&["run", &bad, "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains(r_needles[0])
            || r.stderr
                .contains("training constraints must use training instances"),
        "{r:?}"
    );
    assert_eq!(env.snapshot(), before);
}

#[test]
fn bad_selector_key_suggests_the_nearest() {
    rejects(
        None,
        &[],
        &["datset=blobs"],
        &["unknown selector key `datset`", "did you mean `dataset`?"],
    );
}

#[test]
fn bad_selector_value_lists_the_values() {
    rejects(
        None,
        &[],
        &["method=nope"],
        &["selector `method=nope` matches nothing", "probpair"],
    );
}

#[test]
fn malformed_override() {
    rejects(
        None,
        &[],
        &["--set", "constraints.corruption"],
        &["`--set constraints.corruption` is not of the form key=value"],
    );
}

#[test]
fn out_of_range_override() {
    rejects(
        None,
        &[],
        &["--set", "constraints.corruption=1.5"],
        &["must be in [0, 1]", "1.5"],
    );
}

#[test]
fn unknown_override_key_suggests_the_nearest() {
    rejects(
        None,
        &[],
        &["--set", "train.epoch=3"],
        &["unknown field `epoch`", "did you mean `epochs`?"],
    );
}

#[test]
fn figure_of_a_method_without_diagnostics_is_refused() {
    let spec = format!("{TINY_SPEC}  fig:\n    kind: figure\n    grid: {{dataset: [blobs], supervision: [lv0.1], method: [probpair]}}\n");
    rejects(
        Some(&spec),
        &[],
        &[],
        &["kind: figure", "method `probpair`", "records none"],
    );
}

#[test]
fn eci_settings_on_a_non_eci_method_are_refused() {
    rejects(
        Some(&tiny_with(
            "  probpair: {}",
            "  probpair: {eci: {gamma: 5}}",
        )),
        &[],
        &[],
        &["sets `eci`", "kind: eci-pp"],
    );
}

#[test]
fn pickled_npy_is_refused_naming_the_format_that_reads_it() {
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '|O', 'fortran_order': False, 'shape': (), }          \n";
    npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    let spec = tiny_with(
        "format: csv\n    files: {data: blobs.csv}",
        "format: npy\n    files: {x: x.npy, y: x.npy}",
    );
    rejects(
        Some(&spec),
        &[("x.npy", &npy)],
        &[],
        &["pickled Python objects", "format: pickle"],
    );
}

/// Run the tiny spec with its supervision from `cons` (CSV) and return the result.
fn with_constraints_file(cons: &str) -> (Env, Ran) {
    let spec = tiny_with(
        "lv0.1: {kind: single, level: 0.1}",
        "mine: {kind: file, path: cons.csv}",
    )
    .replace("supervision: [lv0.1]", "supervision: [mine]");
    let env = Env::new();
    env.write("bad.yaml", &spec);
    std::fs::write(env.path("cons.csv"), cons).unwrap();
    let bad = env.path("bad.yaml").display().to_string();
    let r = env.upcc(&["run", &bad, "--progress", "none"]);
    (env, r)
}

#[test]
fn file_constraints_pairing_an_instance_with_itself_are_refused() {
    let (_env, r) = with_constraints_file("a,b,y\n0,1,0.5\n7,7,1.0\n");
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains("constraint 2 pairs instance 7 with itself"),
        "{r:?}"
    );
}

#[test]
fn file_constraints_with_sparse_expert_ids_are_refused() {
    let (_env, r) = with_constraints_file("a,b,y,expert\n0,1,0.5,0\n2,3,0.4,60000\n");
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("must number the experts 0, 1, …, E−1") && r.stderr.contains("0, 60000"),
        "{r:?}"
    );
    let (_env, r) = with_constraints_file("a,b,y,expert\n0,1,0.5,0\n2,3,0.4,70000\n");
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("expert id 70000 is too large"), "{r:?}");
}

#[test]
fn a_test_split_instance_error_says_how_to_find_training_rows() {
    // Every row of the blobs file: some are in the test split.
    let rows: String = (0..120).map(|i| format!("{i},{},0.5\n", i + 120)).collect();
    let (_env, r) = with_constraints_file(&format!("a,b,y\n{rows}"));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("from the test split")
            && r.stderr.contains("stage=features")
            && r.stderr.contains("`split` column"),
        "{r:?}"
    );
}

#[test]
fn with_json_the_problems_come_located_on_stdout() {
    let env = Env::new();
    let bad = tiny_with("corruption: 0.3", "corruptoin: 0.3").replace("n_init: 2", "n_init: 0");
    env.write("bad.yaml", &bad);
    let spec = env.path("bad.yaml").display().to_string();
    let r = env.upcc(&["status", &spec, "--json", "--set", "train.epochs=0"]);
    assert_eq!(r.code, 2, "{r:?}");
    let j = r.json();
    let e = &j["error"];
    assert_eq!(e["tier"], "user", "{j}");
    assert_eq!(e["exit_code"], 2, "{j}");
    let problems = e["problems"].as_array().unwrap();
    assert!(problems.len() >= 2, "{j}");
    let unknown = problems
        .iter()
        .find(|p| p["message"].as_str().unwrap().contains("corruptoin"))
        .unwrap_or_else(|| panic!("{j}"));
    assert_eq!(unknown["place"]["kind"], "line", "{j}");
    assert_eq!(
        unknown["place"]["line"],
        line_of(TINY_SPEC, "corruption: 0.3") as u64,
        "{j}"
    );
    assert_eq!(unknown["hint"], "did you mean `corruption`?", "{j}");
    let set = problems
        .iter()
        .find(|p| p["place"]["kind"] == "set")
        .unwrap_or_else(|| panic!("{j}"));
    assert_eq!(set["place"]["arg"], "train.epochs=0", "{j}");
    // The same problems on stderr, as text.
    assert!(r.stderr.contains("`--set train.epochs=0`"), "{r:?}");
}

/// A data error found while running keeps its fields: `run --json` reports the file, line
/// and column beside the message, for tools that point an editor at them.
#[test]
fn a_data_error_keeps_its_file_and_place_in_run_json() {
    let env = Env::new();
    let mut lines: Vec<String> = blobs_csv(240).lines().map(|l| l.to_string()).collect();
    let mut fields: Vec<String> = lines[5].split(',').map(|f| f.to_string()).collect();
    fields[2] = "nan".into();
    lines[5] = fields.join(",");
    env.write("nan.csv", &(lines.join("\n") + "\n"));
    env.write("nan.yaml", &tiny_with("data: blobs.csv", "data: nan.csv"));
    let spec = env.path("nan.yaml").display().to_string();
    let r = env.upcc(&["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    let j = r.json();
    let failed: Vec<&serde_json::Value> = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["outcome"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{j}");
    let d = &failed[0]["error_detail"];
    assert_eq!(d["kind"], "data", "{j}");
    assert!(d["file"].as_str().unwrap().ends_with("nan.csv"), "{d}");
    assert_eq!(d["place"]["line"], 6, "{d}");
    assert_eq!(d["place"]["column"], 3, "{d}");
    assert!(d["message"].as_str().unwrap().contains("not finite"), "{d}");
}

#[test]
fn a_misspelt_method_entry_is_one_problem_not_one_per_grid() {
    let env = Env::new();
    let smoke = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/smoke.yaml"),
    )
    .unwrap()
    .replace("  weighted-probpair: {}\n", "  weighted-probpiar: {}\n");
    env.write("typo.yaml", &smoke);
    let r = env.upcc(&["status", &env.path("typo.yaml").display().to_string()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("did you mean `weighted-probpair`?"),
        "{}",
        r.stderr
    );
    // The grids that name `weighted-probpair` are not reported again, suggesting the typo.
    assert!(
        !r.stderr.contains("did you mean `weighted-probpiar`"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("has 1 problem") || !r.stderr.contains("problems"),
        "{}",
        r.stderr
    );
}
