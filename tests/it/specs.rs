//! Every spec shipped in experiments/ loads, validates and plans.

use crate::util::*;

#[test]
fn every_shipped_spec_plans() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let env = Env::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let r = env.upcc(&["status", path.to_str().unwrap(), "--json"]);
            assert_eq!(r.code, 0, "{}: {r:?}", path.display());
            assert!(r.json()["total"].as_u64().unwrap() > 0);
            checked += 1;
        }
    }
    assert!(checked >= 3, "found {checked} specs");
}
