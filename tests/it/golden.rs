//! Golden node keys. A change to key material — parameter serialisation, the canonical JSON,
//! the key schema, or the bytes a dependency writes into an upstream output (Parquet) — would
//! silently re-key every store and recompute everything. If one of these fails, the change is
//! either a bug or deliberate: then bump what changed (a stage's VERSION or KEY_SCHEMA_VERSION),
//! say so in the commit and update the hex here.

use crate::util::*;

#[test]
fn the_smoke_specs_first_node_keys_are_pinned() {
    let env = Env::new();
    let r = env.upcc(&[
        "--device",
        "cpu",
        "run",
        "smoke",
        "stage=features",
        "--progress",
        "none",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let s = env
        .upcc(&["--numerics", "cpu-f32-avx512", "status", "smoke", "--json"])
        .json();
    // The key without the stage's code digests (which change with every edit of its source,
    // deliberately: `tests/it/results.rs` checks that), from the material `explain` prints.
    let key = |id: &str| -> String {
        let listed = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .unwrap_or_else(|| panic!("no node {id}"))["key"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let e = env
            .upcc(&[
                "--numerics",
                "cpu-f32-avx512",
                "explain",
                "smoke",
                id,
                "--json",
            ])
            .json();
        let mut m: upcc_engine::KeyMaterial =
            serde_json::from_value(e["material"].clone()).unwrap();
        assert_eq!(m.digest().unwrap().to_hex(), listed, "{id}");
        assert!(
            !m.code.is_empty() && m.code.contains_key("stages/core/src/table.rs"),
            "{id}: {:?}",
            m.code
        );
        m.code.clear();
        m.digest().unwrap().to_hex()
    };
    // The features node: the embedded data, the feature parameters, the key schema.
    assert_eq!(
        key("features/mnist5k"),
        "d6f0953b62f5ff05d7f613b2863c2c210dbfddb147b47e7fdc0b447df01b8f94"
    );
    // Nodes reading the features: also the features' output bytes (the Parquet writer) and,
    // for training nodes, the numerics class, pinned here to AVX-512's whatever this machine
    // computes. (Re-keyed once, deliberately: the CPU class names its instruction set since
    // the depth blocking is pinned, `cpu-f32` → `cpu-f32-avx512`.)
    // (Re-keyed once, deliberately: experts are shared by the trials, seed 0, since the
    // paper trains one expert per dataset and setting; `expert.per_trial: true` gives t1..tN.)
    assert_eq!(
        key("expert/mnist5k/lv0.01/s0"),
        "1dfa69e16263d703c0e47f23674e2f82044d3c041606a947c8ed2267fe355a1d"
    );
    assert_eq!(
        key("pretrain/mnist5k/s0"),
        "60530cd6b0a4060c11f6f628bd4f4d1280817895892cfb14e87f518554e9da9a"
    );
}
