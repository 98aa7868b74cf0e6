//! Caching: nothing reruns twice, a change reruns exactly what depends on it.

use crate::util::*;

fn cell_ids(stage: &str) -> Vec<String> {
    let mut v = Vec::new();
    for m in ["probpair", "weighted-probpair"] {
        for p in ["pre", "nopre"] {
            for t in [1, 2] {
                v.push(format!("{stage}/blobs/lv0.1/{m}/{p}/t{t}"));
            }
        }
    }
    v
}

#[test]
fn second_identical_run_executes_nothing() {
    let env = Env::new();
    let first = env.run_ok(&[]);
    assert_eq!(first["executed"], TINY_NODES);
    let spec = env.spec();
    let r = env.upcc(&["run", &spec, "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains(&format!("all {TINY_NODES} nodes cached")),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("| blobs | lv0.1 | NMI |"),
        "the table is printed: {r:?}"
    );
    let again = env.run_ok(&[]);
    assert_eq!(
        (again["executed"].as_u64(), again["cached"].as_u64()),
        (Some(0), Some(TINY_NODES as u64))
    );
}

#[test]
fn corruption_change_reruns_exactly_the_downstream_nodes() {
    let env = Env::new();
    env.run_ok(&[]);
    let mut expected = vec![
        "constraints/blobs/lv0.1/t1".to_string(),
        "constraints/blobs/lv0.1/t2".to_string(),
        "table/main".to_string(),
    ];
    for s in ["train", "cluster", "metrics"] {
        expected.extend(cell_ids(s));
    }
    expected.sort();
    // The plan marks exactly the downstream nodes stale…
    let spec = env.spec();
    let s = env
        .upcc(&[
            "status",
            &spec,
            "--json",
            "--set",
            "constraints.corruption=0.5",
        ])
        .json();
    let mut stale: Vec<String> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["status"] == "stale")
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    stale.sort();
    assert_eq!(stale, expected);
    // …and the run executes them, except where early cutoff proves a node unchanged (a
    // clustering whose assignments are byte-identical to a stored one needs no new metrics).
    let r = env.run_ok(&["--set", "constraints.corruption=0.5"]);
    let executed = ids_with(&r, "executed");
    assert!(
        executed.iter().all(|id| expected.contains(id)),
        "ran something upstream: {executed:?}"
    );
    for id in expected
        .iter()
        .filter(|id| id.starts_with("constraints/") || id.starts_with("train/"))
    {
        assert!(
            executed.contains(id),
            "`{id}` should have rerun: {executed:?}"
        );
    }
    assert_eq!(
        r["executed"].as_u64().unwrap() + r["cached"].as_u64().unwrap(),
        TINY_NODES as u64
    );
}

#[test]
fn table_only_parameter_reruns_no_training() {
    let env = Env::new();
    env.run_ok(&[]);
    let r = env.run_ok(&["--set", "table.decimals=2", "--set", "table.nmi=arithmetic"]);
    assert_eq!(ids_with(&r, "executed"), ["table/main"]);
    assert!(
        r["tables"]["main"]
            .as_str()
            .unwrap()
            .contains("arithmetic mean"),
        "{r}"
    );
}

#[test]
fn same_bytes_from_a_different_source_cut_off_downstream() {
    use std::io::Write;
    let env = Env::new();
    env.run_ok(&[]);
    // The same data, gzipped: the features key changes, its output bytes do not.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&std::fs::read(env.path("blobs.csv")).unwrap())
        .unwrap();
    std::fs::write(env.path("blobs.csv.gz"), gz.finish().unwrap()).unwrap();
    let r = env.run_ok(&["--set", "datasets.blobs.files.data=blobs.csv.gz"]);
    assert_eq!(ids_with(&r, "executed"), ["features/blobs"]);
    assert_eq!(r["cached"], TINY_NODES - 1);
}

#[test]
fn status_says_which_parameter_made_a_node_stale() {
    let env = Env::new();
    let spec = env.spec();
    let before = env.upcc(&["status", &spec, "--json"]);
    assert_eq!(before.json()["missing"], TINY_NODES, "{before:?}");
    assert!(!env.store().exists(), "status must not create the store");
    env.run_ok(&[]);
    let r = env.upcc(&[
        "status",
        &spec,
        "--json",
        "--set",
        "constraints.corruption=0.5",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let j = r.json();
    assert_eq!(j["stale"], 27);
    assert_eq!(j["fresh"], 3);
    let node = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "constraints/blobs/lv0.1/t1")
        .unwrap();
    assert_eq!(node["status"], "stale");
    assert_eq!(
        node["reasons"][0],
        "param `settings.corruption` changed 0.3 → 0.5"
    );
    // The text form says the same.
    let t = env.upcc(&["status", &spec, "--set", "constraints.corruption=0.5"]);
    assert!(
        t.stdout
            .contains("param `settings.corruption` changed 0.3 → 0.5"),
        "{t:?}"
    );
    assert!(
        t.stdout.contains("30 nodes: 3 fresh, 27 stale, 0 missing"),
        "{t:?}"
    );
}

#[test]
fn one_cell_runs_alone_and_the_table_shows_the_rest_as_missing() {
    let env = Env::new();
    let r = env.run_ok(&["method=probpair", "pretrain=false", "trial=1"]);
    assert_eq!(
        ids_with(&r, "executed"),
        [
            "cluster/blobs/lv0.1/probpair/nopre/t1",
            "constraints/blobs/lv0.1/t1",
            "expert/blobs/lv0.1/s0",
            "features/blobs",
            "metrics/blobs/lv0.1/probpair/nopre/t1",
            "train/blobs/lv0.1/probpair/nopre/t1",
        ]
    );
    let table = r["tables"]["main"].as_str().unwrap();
    assert!(table.contains("— / —"), "{table}");
    assert!(table.contains("0 of 4 cells complete"), "{table}");
}

#[test]
fn explain_shows_key_inputs_manifest_and_provenance() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let r = env.upcc(&["explain", &spec, "train/blobs/lv0.1/probpair/pre/t1", "-v"]);
    assert_eq!(r.code, 0, "{r:?}");
    for needle in [
        "status    fresh",
        "constraints  ← constraints/blobs/lv0.1/t1",
        "weights      ← pretrain/blobs/s0",
        "embeddings",
        "computed",
        "key material",
        "\"stage_version\":1",
    ] {
        assert!(r.stdout.contains(needle), "missing `{needle}`: {r:?}");
    }
    let j = manifest(&env, &spec, "train/blobs/lv0.1/probpair/pre/t1", &[]);
    assert_eq!(j["provenance"]["tool"], "upcc");
    assert!(j["provenance"]["duration_s"].as_f64().unwrap() >= 0.0);
    // Why stale, for one node.
    let s = env.upcc(&[
        "explain",
        &spec,
        "constraints/blobs/lv0.1/t2",
        "--set",
        "constraints.budget=200",
    ]);
    assert!(
        s.stdout
            .contains("why       param `settings.budget` changed 300 → 200"),
        "{s:?}"
    );
}

#[test]
fn status_estimates_the_time_left_from_comparable_recorded_nodes() {
    let env = Env::new();
    let spec = env.spec();
    // A store with nothing comparable: no basis, said so.
    let r = env.upcc(&["status", &spec]);
    assert!(r.stdout.contains("no basis for a time estimate"), "{r:?}");
    let first = env.run_ok(&[]);
    let recorded: std::collections::BTreeMap<String, (String, f64)> = first["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap().to_string(),
                (
                    n["stage"].as_str().unwrap().to_string(),
                    n["duration_s"].as_f64().unwrap(),
                ),
            )
        })
        .collect();
    // Twice the training epochs: the training nodes' recorded times count double, the rest
    // (clustering, metrics, the table) once.
    let r = env.upcc(&["status", &spec, "--set", "train.epochs=6", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let stale: Vec<&str> = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["status"] == "stale")
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(j["estimate"]["with_basis"], stale.len(), "{j}");
    assert_eq!(j["estimate"]["without_basis"], 0, "{j}");
    let want: f64 = stale
        .iter()
        .map(|id| {
            let (stage, d) = &recorded[*id];
            if stage == "train" {
                2.0 * d
            } else {
                *d
            }
        })
        .sum();
    let got = j["estimate"]["seconds"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-6 * want.max(1e-9),
        "{got} vs {want}"
    );
    let t = env.upcc(&["status", &spec, "--set", "train.epochs=6"]);
    assert!(
        t.stdout.contains(&format!(
            "for the {} nodes to compute (from the recorded times of comparable nodes)",
            stale.len()
        )),
        "{t:?}"
    );
}
