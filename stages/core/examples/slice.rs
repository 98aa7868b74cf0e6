//! One table cell end to end without the engine (development aid):
//! `cargo run --release -p upcc-stages --example slice -- [epochs] [pretrain_epochs] [method]`.
use std::collections::BTreeMap;
use std::time::Instant;

use upcc_stages::*;

struct Print;
impl Monitor for Print {
    fn log(&mut self, m: &str) {
        eprintln!("  {m}");
    }
    fn progress(&mut self, _d: u64, _t: u64, _m: &str) {}
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let epochs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(40);
    let pre: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    let weighted = args.get(3).map(|s| s == "wpp").unwrap_or(false);
    let bytes = std::fs::read("experiments/data/mnist5k.csv.gz").expect("run from the repo root");
    let t0 = Instant::now();
    let fp = features::FeatureParams {
        format: features::DataFormat::Csv,
        label_column: "last".into(),
        header: features::HeaderMode::No,
        scaling: features::Scaling::Multiply(0.02),
        split: features::Split {
            kind: features::SplitKind::Stratified,
            test_fraction: 0.2,
            seed: 0,
        },
        n_classes: Some(10),
    };
    let files = BTreeMap::from([(
        "data".to_string(),
        features::SourceFile {
            display: "mnist5k".into(),
            bytes: &bytes,
        },
    )]);
    let f = features::build(&fp, &files).unwrap();
    eprintln!("features {:.2}s", t0.elapsed().as_secs_f64());
    let t = Instant::now();
    let ep = expert::ExpertParams {
        setting: expert::ExpertSetting::Single {
            level: std::env::var("LEVEL")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.01),
        },
        classifier: Default::default(),
        seed: 1,
    };
    let (probs, sum) = expert::run(&ep, &f, &mut Print).unwrap();
    eprintln!(
        "expert {:.2}s acc {:.3}",
        t.elapsed().as_secs_f64(),
        sum[0].test_accuracy
    );
    let cp = constraints::ConstraintParams {
        settings: constraints::ConstraintSettings {
            budget: std::env::var("BUDGET")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(3000),
            corruption: std::env::var("PI")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.3),
            diagnostic_pairs: 1000,
        },
        seed: 1,
    };
    let (cons, _diag) = constraints::generate(&cp, &f, &probs).unwrap();
    let weights = if pre > 0 {
        let t = Instant::now();
        let pp = pretrain::PretrainParams {
            settings: pretrain::PretrainSettings {
                layerwise_epochs: pre,
                finetune_epochs: 2 * pre,
                ..Default::default()
            },
            embedding_dim: 10,
            seed: 0,
        };
        let r = pretrain::run(&pp, &f, &mut Print).unwrap();
        eprintln!("pretrain {:.2}s", t.elapsed().as_secs_f64());
        Some(r.weights)
    } else {
        None
    };
    let t = Instant::now();
    let tp = train::TrainParams::new(
        train::TrainSettings {
            epochs,
            ..Default::default()
        },
        if weighted {
            train::Weighting::Kappa
        } else {
            train::Weighting::None
        },
        10,
        weights.is_some(),
        1,
    );
    let tr = train::run(&tp, &f, &cons, weights.as_deref(), &mut Print).unwrap();
    eprintln!(
        "train {:.2}s ({:.3}s/epoch)",
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() / epochs as f64
    );
    let clp = cluster::ClusterParams {
        settings: cluster::ClusterSettings {
            n_init: 10,
            ..Default::default()
        },
        k: 0,
        seed: 1,
    };
    let (a, _) = cluster::run(
        &clp,
        &tr.embeddings,
        tr.dim,
        &f.labels,
        &f.is_test,
        &f.ids,
        f.n_classes,
    )
    .unwrap();
    for s in metrics::run(&a) {
        eprintln!(
            "{}: acc {:.3} nmi {:.3}/{:.3} ari {:.3}",
            s.split, s.acc, s.nmi_arithmetic, s.nmi_geometric, s.ari
        );
    }
    let (raw, _) = cluster::run(
        &clp,
        &f.x,
        f.dim,
        &f.labels,
        &f.is_test,
        &f.ids,
        f.n_classes,
    )
    .unwrap();
    for s in metrics::run(&raw) {
        eprintln!(
            "raw k-means {}: acc {:.3} nmi {:.3}/{:.3} ari {:.3}",
            s.split, s.acc, s.nmi_arithmetic, s.nmi_geometric, s.ari
        );
    }
    eprintln!("total {:.1}s", t0.elapsed().as_secs_f64());
}
