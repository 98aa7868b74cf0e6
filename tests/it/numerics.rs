//! ProbPair learns something real: on the MNIST sample it beats k-means on raw pixels.

use std::collections::BTreeMap;

use upcc_stages::{cluster, features, metrics};

use crate::util::*;

#[test]
fn probpair_on_the_smoke_data_beats_kmeans_on_raw_pixels_in_nmi() {
    let env = Env::new();
    // The embedded smoke spec, one cell, one trial; a stronger expert (lv0.1) than the smoke
    // table's lv0.01 so the comparison is about the method, not a 40-image expert.
    let r = env.upcc(&[
        "run",
        "smoke",
        "--json",
        "--progress",
        "none",
        "supervision=lv0.01",
        "method=probpair",
        "pretrain=true",
        "trial=1",
        "--set",
        "supervision.lv0.01.level=0.1",
        "--set",
        "train.epochs=30",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let m = manifest(
        &env,
        "smoke",
        "metrics/mnist5k/lv0.01/probpair/pre/t1",
        &[
            "--set",
            "supervision.lv0.01.level=0.1",
            "--set",
            "train.epochs=30",
        ],
    );
    let digest = m["outputs"]["metrics"]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let scores = metrics::from_parquet(
        &std::fs::read(
            env.store()
                .join("objects")
                .join(&digest[..2])
                .join(&digest[2..]),
        )
        .unwrap(),
    )
    .unwrap();

    // k-means on the raw (scaled) pixels of the same split.
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
        validation: 0,
        validation_order: None,
        labels: None,
    };
    let files = BTreeMap::from([(
        "data".to_string(),
        features::SourceFile {
            display: "mnist5k".into(),
            bytes: upcc_model::specs::MNIST5K,
        },
    )]);
    let f = features::build(&fp, &files).unwrap();
    let cp = cluster::ClusterParams {
        settings: cluster::ClusterSettings {
            n_init: 10,
            ..Default::default()
        },
        k: 0,
        seed: 1,
    };
    let (a, _) = cluster::run(
        &cp,
        &f.x,
        f.dim,
        &f.labels,
        &f.is_test,
        &f.is_val,
        &f.ids,
        f.n_classes,
    )
    .unwrap();
    let raw = metrics::run(&a);
    for (p, k) in scores.iter().zip(&raw) {
        assert_eq!(p.split, k.split);
        eprintln!(
            "{}: ProbPair NMI {:.4}, k-means on raw pixels NMI {:.4}",
            p.split, p.nmi_geometric, k.nmi_geometric
        );
        assert!(
            p.nmi_geometric > k.nmi_geometric + 0.03,
            "{}: ProbPair NMI {:.3} vs raw k-means {:.3}",
            p.split,
            p.nmi_geometric,
            k.nmi_geometric
        );
    }
}

#[test]
fn sdae_pretraining_reduces_reconstruction_error() {
    let env = Env::new();
    let set = [
        "--set",
        "pretrain.layerwise_epochs=4",
        "--set",
        "pretrain.finetune_epochs=8",
    ];
    let mut args = vec!["run", "smoke", "--progress", "none", "stage=pretrain"];
    args.extend_from_slice(&set);
    let r = env.upcc(&args);
    assert_eq!(r.code, 0, "{r:?}");
    let m = manifest(&env, "smoke", "pretrain/mnist5k/s0", &set);
    let before = m["summary"]["train_mse_init"].as_f64().unwrap();
    let after = m["summary"]["train_mse"].as_f64().unwrap();
    assert!(
        after < 0.8 * before,
        "reconstruction MSE {before} → {after}"
    );
    assert!(m["summary"]["test_mse"].as_f64().unwrap() < before);
}
