//! The paper's other target kinds: sweep figures (robustness, sensitivity), the experts'
//! blind-spot counts (Table 2), the constraint-value histograms and the runtime table
//! (Table 11).

use crate::util::*;

/// TINY_SPEC with a second supervision setting, two multi-expert ones and the four kinds.
fn targets_spec() -> String {
    let s = TINY_SPEC.replacen(
        "  lv0.1: {kind: single, level: 0.1}\n",
        "  lv0.1: {kind: single, level: 0.1}\n  lv0.3: {kind: single, level: 0.3}\n  multi2: {kind: multi, experts: 2}\n  multi3: {kind: multi, experts: 3}\n",
        1,
    );
    let targets = s.find("targets:").unwrap();
    format!(
        "{}targets:
  main:
    grid: {{dataset: [blobs], supervision: [lv0.1, lv0.3], method: [probpair, weighted-probpair], pretrain: [false]}}
    columns: [method]
  sweep:
    kind: sweep
    title: robustness
    x: supervision
    metrics: [acc, nmi]
    grid: {{dataset: [blobs], supervision: [lv0.1, lv0.3], method: [probpair, weighted-probpair], pretrain: [false]}}
  blind:
    kind: blind-spots
    grid: {{dataset: [blobs], supervision: [multi2, multi3]}}
  values:
    kind: constraint-values
    grid: {{dataset: [blobs], supervision: [lv0.1, multi2]}}
  runtime:
    kind: runtime
    grid: {{dataset: [blobs], supervision: [lv0.1], method: [probpair, weighted-probpair], pretrain: [false]}}
",
        &s[..targets]
    )
}

/// A small Parquet table's rows as JSON objects.
fn parquet_rows(path: &std::path::Path) -> Vec<serde_json::Value> {
    use polars::prelude::*;
    use serde_json::json;
    let df = ParquetReader::new(std::fs::File::open(path).unwrap())
        .finish()
        .unwrap();
    let mut rows = vec![serde_json::Map::new(); df.height()];
    for col in df.columns() {
        let name = col.name().to_string();
        for (i, v) in col.as_materialized_series().iter().enumerate() {
            let j = match v {
                AnyValue::Null => serde_json::Value::Null,
                AnyValue::String(s) => json!(s),
                AnyValue::StringOwned(s) => json!(s.as_str()),
                AnyValue::UInt16(x) => json!(x),
                AnyValue::UInt32(x) => json!(x),
                AnyValue::UInt64(x) => json!(x),
                AnyValue::Float32(x) => json!(x as f64),
                AnyValue::Float64(x) => json!(x),
                other => json!(other.to_string()),
            };
            rows[i].insert(name.clone(), j);
        }
    }
    rows.into_iter().map(serde_json::Value::Object).collect()
}

#[test]
fn sweep_blind_spots_values_and_runtime_targets_end_to_end() {
    let env = Env::new();
    env.write("spec.yaml", &targets_spec());
    let r = env.run_ok(&[]);
    assert_eq!(r["failed"], 0, "{r}");

    // Sweep: each plotted point is the table's mean ± std of the same cell.
    assert!(
        r["tables"]["sweep"].as_str().unwrap().contains("figure: "),
        "{r}"
    );
    let png = std::fs::read(output_path(&env, "figure/sweep", "png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = String::from_utf8(std::fs::read(output_path(&env, "figure/sweep", "svg")).unwrap())
        .unwrap();
    // The legend names methods as the paper does.
    for label in ["lv0.3", "Weighted ProbPair", "NMI"] {
        assert!(svg.contains(label), "the sweep's SVG lacks `{label}`");
    }
    let points = parquet_rows(&output_path(&env, "figure/sweep", "table"));
    assert_eq!(
        points.len(),
        2 * 2 * 2,
        "2 metrics × 2 methods × 2 levels: {points:?}"
    );
    let table = parquet_rows(&output_path(&env, "table/main", "table"));
    for p in &points {
        let row = table
            .iter()
            .find(|t| {
                t["supervision"] == p["x"]
                    && t["method"] == p["line"]
                    && t["split"] == "test"
                    && t["metric"] == p["metric"]
            })
            .unwrap_or_else(|| panic!("no table row for {p}"));
        let (a, b) = (p["mean"].as_f64().unwrap(), row["mean"].as_f64().unwrap());
        assert!((a - b).abs() < 1e-4, "{p} vs {row} (the table stores f32)");
        assert_eq!(p["n"], 2);
    }

    // Table 2: the blind spots of 2 and 3 experts over 4 classes, as the paper's protocol
    // assigns them (consecutive balanced blocks).
    let blind = r["tables"]["blind"].as_str().unwrap();
    assert!(blind.contains("| blobs | (2,2) | (2,1,1) |"), "{blind}");

    // Constraint values: every record of the first trial in one bin, corrupted ones apart.
    let bins = parquet_rows(&output_path(&env, "figure/values", "table"));
    for sup in ["lv0.1", "multi2"] {
        let of: Vec<&serde_json::Value> = bins.iter().filter(|b| b["supervision"] == sup).collect();
        assert_eq!(of.len(), 20);
        let clean: u64 = of.iter().map(|b| b["clean"].as_u64().unwrap()).sum();
        let corrupted: u64 = of.iter().map(|b| b["corrupted"].as_u64().unwrap()).sum();
        assert_eq!(clean + corrupted, 300, "{sup}: the budget");
        // π = 0.3 of 300 records: well away from 0 and from all of them.
        assert!(
            (50..=130).contains(&corrupted),
            "{sup}: {corrupted} corrupted"
        );
    }

    // Table 11: the runtime of a cell without pretraining is its training node's recorded
    // time, mean over the trials, in the paper's `0m01s` style.
    let runtime = r["tables"]["runtime"].as_str().unwrap();
    assert!(
        runtime.contains("| lv0.1 | probpair | false | 0m"),
        "{runtime}"
    );
    let out = env.path("report").display().to_string();
    let spec = env.spec();
    let rep = env.upcc(&[
        "report",
        &spec,
        "target=runtime,blind,sweep,values",
        "--out",
        &out,
    ]);
    assert_eq!(rep.code, 0, "{rep:?}");
    let csv = std::fs::read_to_string(env.path("report/runtime/table.csv")).unwrap();
    let line = csv
        .lines()
        .find(|l| l.contains(",probpair,"))
        .unwrap_or_else(|| panic!("{csv}"));
    let seconds: f64 = line.rsplit(',').next().unwrap().parse().unwrap();
    let want: f64 = [1, 2]
        .iter()
        .map(|t| {
            manifest(
                &env,
                &spec,
                &format!("train/blobs/lv0.1/probpair/nopre/t{t}"),
                &[],
            )["provenance"]["duration_s"]
                .as_f64()
                .unwrap()
        })
        .sum::<f64>()
        / 2.0;
    assert!((seconds - want).abs() < 1e-6, "{seconds} vs {want}");
    for f in ["sweep/figure.svg", "values/figure.png", "blind/table.tex"] {
        assert!(env.path("report").join(f).exists(), "report lacks {f}");
    }
    // Nothing reran for the report, and a second run computes nothing.
    let again = env.run_ok(&[]);
    assert_eq!(again["executed"], 0, "{again}");
}

#[test]
fn sweep_targets_name_their_axes() {
    let env = Env::new();
    let spec = targets_spec();
    for (from, to, needle) in [
        ("    x: supervision\n", "", "needs `x`"),
        (
            "    x: supervision\n",
            "    x: corruption\n",
            "`x: corruption` is not an axis of its grid",
        ),
        (
            "    x: supervision\n",
            "    x: supervision\n    lines: supervision\n",
            "`lines` and `x` are both `supervision`",
        ),
        (
            "    kind: blind-spots\n",
            "    kind: blind-spots\n    x: dataset\n",
            "places a sweep figure's axes",
        ),
        (
            "grid: {dataset: [blobs], supervision: [multi2, multi3]}",
            "grid: {dataset: [blobs], supervision: [multi2, multi3], method: [probpair]}",
            "kind: blind-spots) is indexed by dataset and supervision only",
        ),
    ] {
        env.write("spec.yaml", &spec.replacen(from, to, 1));
        let r = env.upcc(&["status", &env.spec()]);
        assert_eq!(r.code, 2, "{r:?}");
        assert!(r.stderr.contains(needle), "want `{needle}`: {}", r.stderr);
        assert!(!env.store().join("objects").exists() || env.snapshot().is_empty());
    }
}
