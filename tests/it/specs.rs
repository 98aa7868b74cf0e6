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

/// Every table and figure of the paper is a target of experiments/paper.yaml, named by its
/// `\label` in the target's title — except the method diagram and the diagnostics figure of
/// RCV1-10, the one dataset the spec declares only as a commented local file.
#[test]
fn the_paper_spec_has_a_target_for_every_table_and_figure() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = std::fs::read_to_string(root.join("experiments/paper.yaml")).unwrap();
    // Target titles only (not comments).
    let titles: String = spec
        .lines()
        .filter(|l| l.trim_start().starts_with("title:"))
        .collect::<Vec<_>>()
        .join("\n");
    let Some(tex) = crate::util::paper_tex() else {
        return;
    };
    let not_targets = ["fig:eci", "fig:app_diag_rcv1"];
    let mut labels = Vec::new();
    for part in tex.split("\\label{").skip(1) {
        let label = &part[..part.find('}').unwrap()];
        if ["fig:", "tab:", "table:"]
            .iter()
            .any(|p| label.starts_with(p))
        {
            labels.push(label.to_string());
        }
    }
    assert!(labels.len() > 30, "{labels:?}");
    let missing: Vec<&String> = labels
        .iter()
        .filter(|l| !not_targets.contains(&l.as_str()) && !titles.contains(l.as_str()))
        .collect();
    assert!(missing.is_empty(), "no target names {missing:?}");
}
