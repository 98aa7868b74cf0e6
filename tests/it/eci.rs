//! ECI-PP with multi-expert supervision, expert tables and the diagnostics figure, end to end.

use crate::util::*;

pub fn eci_spec() -> String {
    let s = TINY_SPEC
        .replacen("  lv0.1: {kind: single, level: 0.1}\n", "  lv0.1: {kind: single, level: 0.1}\n  multi2: {kind: multi, experts: 2}\n", 1)
        .replacen("  weighted-probpair: {}\n", "  weighted-probpair: {}\n  eci-pp: {train: {epochs: 4}, eci: {warmup_epochs: 2, folds: 3}}\n", 1);
    let targets = s.find("targets:").unwrap();
    format!(
        "{}targets:
  main:
    title: eci
    grid: {{dataset: [blobs], supervision: [lv0.1, multi2], method: [probpair, eci-pp], pretrain: [false]}}
    columns: [method]
  experts:
    kind: experts
    grid: {{dataset: [blobs], supervision: [lv0.1, multi2]}}
  diag:
    kind: figure
    grid: {{dataset: [blobs], supervision: [multi2], method: [eci-pp], pretrain: [false]}}
",
        &s[..targets]
    )
}

fn setup() -> (Env, serde_json::Value) {
    let env = Env::new();
    env.write("spec.yaml", &eci_spec());
    let r = env.run_ok(&[]);
    (env, r)
}

#[test]
fn eci_pp_expert_table_and_figure_run_end_to_end() {
    let (env, r) = setup();
    assert_eq!(r["failed"], 0);
    let main = r["tables"]["main"].as_str().unwrap();
    assert!(main.contains("eci-pp") && !main.contains("— / —"), "{main}");
    let experts = r["tables"]["experts"].as_str().unwrap();
    assert!(
        experts.contains("| blobs |") && experts.contains("lv0.1") && experts.contains("multi2"),
        "{experts}"
    );
    assert!(
        r["tables"]["diag"].as_str().unwrap().contains("figure: "),
        "{r}"
    );
    // The figure: PNG and SVG with the eight panels.
    let png = std::fs::read(output_path(&env, "figure/diag", "png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(output_path(&env, "figure/diag", "svg")).unwrap();
    for panel in ["(A)", "(D)", "(E)", "(H)"] {
        assert!(svg.contains(panel), "SVG lacks panel {panel}");
    }
}

#[test]
fn diagnostics_are_recorded_per_iteration_and_in_range() {
    use polars::prelude::*;
    let (env, _) = setup();
    let path = output_path(&env, "train/blobs/multi2/eci-pp/nopre/t1", "diagnostics");
    let df = ParquetReader::new(std::fs::File::open(&path).unwrap())
        .finish()
        .unwrap();
    // Warm-up of 2 epochs, then iterations 3 and 4.
    let it: Vec<u32> = df
        .column("iteration")
        .unwrap()
        .u32()
        .unwrap()
        .iter()
        .map(|v| v.unwrap())
        .collect();
    assert_eq!(it, [2, 3, 4]);
    for c in [
        "brier_estimator",
        "brier_corrected_clean",
        "brier_integrator",
        "gap_clean",
        "auc",
        "ap",
        "auc_oracle",
        "ap_oracle",
    ] {
        for v in df.column(c).unwrap().f64().unwrap().iter() {
            let v = v.unwrap();
            assert!((0.0..=1.0).contains(&v), "{c} = {v}");
        }
    }
}

fn f64_column(path: &std::path::Path, name: &str) -> Vec<f64> {
    use polars::prelude::*;
    let df = ParquetReader::new(std::fs::File::open(path).unwrap())
        .finish()
        .unwrap();
    df.column(name)
        .unwrap()
        .f64()
        .unwrap()
        .iter()
        .map(|v| v.unwrap())
        .collect()
}

/// (panel, iteration) → mean over trials, from a figure's `table` output.
fn figure_means(path: &std::path::Path) -> std::collections::BTreeMap<(String, u32), f64> {
    series_means(path, None)
}

/// The same for one series of the figure (all series when `None`).
fn series_means(
    path: &std::path::Path,
    only: Option<&str>,
) -> std::collections::BTreeMap<(String, u32), f64> {
    use polars::prelude::*;
    let df = ParquetReader::new(std::fs::File::open(path).unwrap())
        .finish()
        .unwrap();
    let series = df.column("series").unwrap().str().unwrap().clone();
    let panel = df.column("panel").unwrap().str().unwrap().clone();
    let it = df.column("iteration").unwrap().u32().unwrap().clone();
    let mean = df.column("mean").unwrap().f64().unwrap().clone();
    (0..df.height())
        .filter(|&i| only.is_none_or(|s| series.get(i) == Some(s)))
        .map(|i| {
            (
                (panel.get(i).unwrap().to_string(), it.get(i).unwrap()),
                mean.get(i).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_figure_with_an_oracle_supervision_cell_keeps_the_other_cells_oracle_runs() {
    let env = Env::new();
    let spec = eci_spec()
        .replacen(
            "  multi2: {kind: multi, experts: 2}\n",
            "  multi2: {kind: multi, experts: 2}\n  truth: {kind: oracle, experts: 2}\n",
            1,
        )
        .replacen(
            "grid: {dataset: [blobs], supervision: [multi2], method: [eci-pp], pretrain: [false]}\n",
            "grid: {dataset: [blobs], supervision: [multi2, truth], method: [eci-pp], pretrain: [false]}\n",
            1,
        );
    env.write("spec.yaml", &spec);
    let r = env.run_ok(&["target=diag"]);
    let ids = ids_with(&r, "executed");
    // No oracle run is derived for the oracle setting itself.
    assert!(!ids.iter().any(|i| i.contains("truth.oracle")), "{ids:?}");
    let figure = output_path(&env, "figure/diag", "table");
    let multi2 = series_means(&figure, Some("multi2"));
    let truth = series_means(&figure, Some("truth"));
    let mean_of = |id: &str, column: &str, k: usize| -> f64 {
        [1, 2]
            .iter()
            .map(|t| {
                f64_column(
                    &output_path(&env, &format!("{id}/t{t}"), "diagnostics"),
                    column,
                )[k]
            })
            .sum::<f64>()
            / 2.0
    };
    for (k, it) in [2u32, 3, 4].iter().enumerate() {
        let want = mean_of("train/blobs/multi2.oracle/eci-pp/nopre", "auc", k);
        assert!((multi2[&("auc_oracle".to_string(), *it)] - want).abs() < 1e-12);
        let own = mean_of("train/blobs/truth/eci-pp/nopre", "auc_oracle", k);
        assert!((truth[&("auc_oracle".to_string(), *it)] - own).abs() < 1e-12);
    }
}

#[test]
fn panels_g_and_h_come_from_a_run_on_oracle_judgments() {
    let (env, r) = setup();
    // The figure's cell ran a second time on oracle judgments: its constraints need no experts.
    let ids: Vec<String> = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    for t in [1, 2] {
        assert!(
            ids.contains(&format!("train/blobs/multi2.oracle/eci-pp/nopre/t{t}")),
            "{ids:?}"
        );
        assert!(
            ids.contains(&format!("constraints/blobs/multi2.oracle/t{t}")),
            "{ids:?}"
        );
    }
    assert!(
        !ids.iter()
            .any(|i| i.starts_with("expert/blobs/multi2.oracle")),
        "{ids:?}"
    );
    let m = manifest(&env, &env.spec(), "constraints/blobs/multi2.oracle/t1", &[]);
    assert_eq!(m["material"]["params"]["oracle_experts"], 2, "{m}");
    // Its training constraints are the oracle's, through the corruption channel.
    let bytes = std::fs::read(output_path(
        &env,
        "constraints/blobs/multi2.oracle/t1",
        "constraints",
    ))
    .unwrap();
    let c = upcc_stages::constraints::Constraints::from_parquet(&bytes, "constraints").unwrap();
    assert_eq!(c.n_experts(), 2);
    for i in 0..c.len() {
        assert!(matches!(c.y_clean[i], Some(v) if v == 0.0 || v == 1.0));
    }
    // G and H are the oracle run's own AUC and AP, averaged over the trials.
    let means = figure_means(&output_path(&env, "figure/diag", "table"));
    for (panel, column) in [("auc_oracle", "auc"), ("ap_oracle", "ap")] {
        let runs: Vec<Vec<f64>> = [1, 2]
            .iter()
            .map(|t| {
                let p = output_path(
                    &env,
                    &format!("train/blobs/multi2.oracle/eci-pp/nopre/t{t}"),
                    "diagnostics",
                );
                f64_column(&p, column)
            })
            .collect();
        for (k, it) in [2u32, 3, 4].iter().enumerate() {
            let want = (runs[0][k] + runs[1][k]) / 2.0;
            let got = means[&(panel.to_string(), *it)];
            assert!(
                (got - want).abs() < 1e-12,
                "{panel} at {it}: {got} vs {want}"
            );
        }
    }
    // `oracle_panels: relabel` draws them from the expert run's relabelled columns, with no
    // second run.
    let spec = eci_spec().replacen(
        "  diag:\n    kind: figure\n",
        "  diag:\n    kind: figure\n    oracle_panels: relabel\n",
        1,
    );
    env.write("spec.yaml", &spec);
    let r = env.run_ok(&[]);
    assert_eq!(ids_with(&r, "executed"), ["figure/diag"]);
    let nodes = r["nodes"].as_array().unwrap();
    assert!(
        !nodes
            .iter()
            .any(|n| n["id"].as_str().unwrap().contains("oracle")),
        "{r}"
    );
    let means = figure_means(&output_path(&env, "figure/diag", "table"));
    let runs: Vec<Vec<f64>> = [1, 2]
        .iter()
        .map(|t| {
            let p = output_path(
                &env,
                &format!("train/blobs/multi2/eci-pp/nopre/t{t}"),
                "diagnostics",
            );
            f64_column(&p, "auc_oracle")
        })
        .collect();
    let got = means[&("auc_oracle".to_string(), 4)];
    assert!((got - (runs[0][2] + runs[1][2]) / 2.0).abs() < 1e-12);
}

#[test]
fn multi_expert_constraints_record_their_expert_and_split_the_budget() {
    use upcc_stages::constraints::Constraints;
    let (env, _) = setup();
    let bytes = std::fs::read(output_path(
        &env,
        "constraints/blobs/multi2/t1",
        "constraints",
    ))
    .unwrap();
    let c = Constraints::from_parquet(&bytes, "constraints").unwrap();
    let per_expert: Vec<usize> = (0..2)
        .map(|e| c.expert.iter().filter(|&&x| x == e).count())
        .collect();
    assert_eq!(per_expert, [150, 150]);
    let corrupted = c.corrupted.iter().filter(|x| **x == Some(true)).count();
    assert!(
        (50..=130).contains(&corrupted),
        "π = 0.3 of 300: {corrupted}"
    );
    for i in 0..c.len() {
        if c.corrupted[i] == Some(false) {
            assert_eq!(Some(c.y[i]), c.y_clean[i]);
        }
    }
}

#[test]
fn an_eci_parameter_reruns_only_eci_nodes_and_their_consumers() {
    let (env, _) = setup();
    let r = env.run_ok(&["--set", "eci.gamma=5"]);
    let executed = ids_with(&r, "executed");
    assert!(
        executed
            .iter()
            .any(|id| id.starts_with("train/") && id.contains("eci-pp")),
        "{executed:?}"
    );
    for id in &executed {
        let downstream =
            id.contains("eci-pp") || id.starts_with("table/main") || id.starts_with("figure/diag");
        assert!(downstream, "`{id}` does not depend on ECI-PP's settings");
    }
}

#[test]
fn the_nmi_variant_reruns_only_the_tables_that_show_nmi() {
    let (env, _) = setup();
    // The experts table shows accuracies and the figure no NMI: neither is redrawn.
    let r = env.run_ok(&["--set", "table.nmi=arithmetic"]);
    assert_eq!(ids_with(&r, "executed"), ["table/main"]);
    // Decimals change every table but not the figure.
    let r = env.run_ok(&["--set", "table.decimals=2"]);
    assert_eq!(ids_with(&r, "executed"), ["table/experts", "table/main"]);
}

#[test]
fn a_corrupt_figure_is_never_shown_and_is_redrawn() {
    let (env, first) = setup();
    let png = output_path(&env, "figure/diag", "png");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&png, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut b = std::fs::read(&png).unwrap();
        let i = b.len() / 2;
        b[i] ^= 0x10;
        std::fs::write(&png, b).unwrap();
    }
    let spec = env.spec();
    let r = env.upcc(&["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j = r.json();
    assert_eq!(ids_with(&j, "executed"), ["figure/diag"], "{j}");
    assert_eq!(
        j["tables"]["diag"], first["tables"]["diag"],
        "the same figure, redrawn"
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(env.upcc(&["verify"]).code, 0);
}
