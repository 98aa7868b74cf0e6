//! The same spec gives the same bytes: in two fresh stores, and on a forced rerun.

use crate::util::*;

fn table_bytes(env: &Env, store: &std::path::Path) -> Vec<u8> {
    let spec = env.spec();
    let r = env.upcc_store(store, &["explain", &spec, "table/main", "--json"]);
    let d = r.json()["manifest"]["outputs"]["table"]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::read(store.join("objects").join(&d[..2]).join(&d[2..])).unwrap()
}

#[test]
fn two_fresh_stores_give_identical_output_digests() {
    let env = Env::new();
    let a = env.run_ok(&[]);
    let other = env.path("store2");
    let spec = env.spec();
    let r = env.upcc_store(
        &other,
        &[
            "run",
            &spec,
            "--json",
            "--progress",
            "none",
            "--threads",
            "1",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let b = r.json();
    // Keys chain through output digests, so equal keys mean equal upstream bytes.
    assert_eq!(keys(&a), keys(&b));
    assert_eq!(table_bytes(&env, &env.store()), table_bytes(&env, &other));
}

#[test]
fn forced_rerun_reproduces_the_same_bytes() {
    let env = Env::new();
    let a = env.run_ok(&[]);
    let before = env.snapshot();
    let b = env.run_ok(&["--force"]);
    assert_eq!(b["executed"], TINY_NODES);
    assert_eq!(keys(&a), keys(&b));
    let objects = |s: &Vec<(String, u64)>| {
        s.iter()
            .filter(|(p, _)| p.starts_with("objects"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(objects(&before), objects(&env.snapshot()));
    assert_eq!(env.upcc(&["verify"]).code, 0);
}
