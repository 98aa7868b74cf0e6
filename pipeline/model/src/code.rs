//! The code in the key: each stage names the source files whose code computes its outputs,
//! and the build embeds those files, so a node's key holds the blake3 of each as this binary
//! was compiled from it. Editing a stage's code (and rebuilding) makes its results stale —
//! `status` says `code changed: stages/core/src/eci.rs` — while the nodes below rerun only if
//! its outputs' bits change (early cutoff: their keys name input digests, not upstream keys).
//! `--keep-code-changes` keeps such results instead.

use std::collections::BTreeMap;
use std::sync::OnceLock;

macro_rules! sources {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../", $path)) as &[u8])),*]
    };
}

/// Every source file some stage names, embedded at build time (cargo rebuilds when one
/// changes).
static SOURCES: &[(&str, &[u8])] = sources![
    "stages/core/src/table.rs",
    "stages/core/src/nets.rs",
    "stages/core/src/features/mod.rs",
    "stages/core/src/features/csv_file.rs",
    "stages/core/src/features/idx.rs",
    "stages/core/src/features/npy.rs",
    "stages/core/src/features/parquet_file.rs",
    "stages/core/src/features/pickle.rs",
    "stages/core/src/features/pickled.rs",
    "stages/core/src/expert.rs",
    "stages/core/src/constraints.rs",
    "stages/core/src/pretrain.rs",
    "stages/core/src/train.rs",
    "stages/core/src/spherepair.rs",
    "stages/core/src/eci.rs",
    "stages/core/src/dcc.rs",
    "stages/core/src/cidec.rs",
    "stages/core/src/ensemble.rs",
    "stages/core/src/cluster.rs",
    "stages/core/src/metrics.rs",
    "stages/nn/src/graph.rs",
    "stages/nn/src/layers.rs",
    "stages/nn/src/optim.rs",
    "stages/nn/src/params.rs",
    "stages/nn/src/rng.rs",
    "stages/nn/src/scalar.rs",
    "stages/nn/src/science.rs",
    "stages/nn/src/device.rs",
    "stages/nn/src/io.rs",
    "stages/nn/src/cpu.rs",
    "stages/nn/src/cuda.rs",
    "stages/nn/src/cuda_kernels.cu",
    "stages/report/src/lib.rs",
    "stages/report/src/text.rs",
    "stages/report/src/selection.rs",
    "stages/report/src/published.rs",
    "stages/report/src/figure.rs",
    "stages/report/src/histogram.rs",
    "stages/report/src/png.rs",
    "stages/report/src/sweep.rs",
    "pipeline/model/src/stage/fetch.rs",
    "pipeline/model/src/stage/features.rs",
    "pipeline/model/src/stage/expert.rs",
    "pipeline/model/src/stage/constraints.rs",
    "pipeline/model/src/stage/pretrain.rs",
    "pipeline/model/src/stage/cluster.rs",
    "pipeline/model/src/stage/metrics.rs",
    "pipeline/model/src/stage/select.rs",
    "pipeline/model/src/method/probpair.rs",
    "pipeline/model/src/method/spherepair.rs",
    "pipeline/model/src/method/eci_pp.rs",
    "pipeline/model/src/method/dcc.rs",
    "pipeline/model/src/method/cidec.rs",
    "pipeline/model/src/method/ensemble.rs",
    "pipeline/model/src/targets/table.rs",
    "pipeline/model/src/targets/figure.rs",
    "pipeline/model/src/targets/sweep.rs",
    "pipeline/model/src/targets/constraint_values.rs",
];

/// The network library every training stage runs on (its backend added by numerics class).
const NN: &[&str] = &[
    "stages/core/src/nets.rs",
    "stages/nn/src/graph.rs",
    "stages/nn/src/layers.rs",
    "stages/nn/src/optim.rs",
    "stages/nn/src/params.rs",
    "stages/nn/src/rng.rs",
    "stages/nn/src/scalar.rs",
    "stages/nn/src/science.rs",
    "stages/nn/src/device.rs",
    "stages/nn/src/io.rs",
];

/// The files of stage `stage` itself (science and wiring), and whether it trains networks.
fn own_files(stage: &str) -> Option<(&'static [&'static str], bool)> {
    Some(match stage {
        "fetch" => (&["pipeline/model/src/stage/fetch.rs"], false),
        "features" => (
            &[
                "stages/core/src/features/mod.rs",
                "stages/core/src/features/csv_file.rs",
                "stages/core/src/features/idx.rs",
                "stages/core/src/features/npy.rs",
                "stages/core/src/features/parquet_file.rs",
                "stages/core/src/features/pickle.rs",
                "stages/core/src/features/pickled.rs",
                "pipeline/model/src/stage/features.rs",
            ],
            false,
        ),
        "expert" => (
            &[
                "stages/core/src/expert.rs",
                "pipeline/model/src/stage/expert.rs",
            ],
            true,
        ),
        "constraints" => (
            &[
                "stages/core/src/constraints.rs",
                "pipeline/model/src/stage/constraints.rs",
            ],
            false,
        ),
        "pretrain" => (
            &[
                "stages/core/src/pretrain.rs",
                "pipeline/model/src/stage/pretrain.rs",
            ],
            true,
        ),
        "train" => (
            &[
                "stages/core/src/train.rs",
                "stages/core/src/spherepair.rs",
                "pipeline/model/src/method/probpair.rs",
                "pipeline/model/src/method/spherepair.rs",
            ],
            true,
        ),
        "eci-pp" => (
            &[
                "stages/core/src/eci.rs",
                "stages/core/src/train.rs",
                "pipeline/model/src/method/eci_pp.rs",
            ],
            true,
        ),
        "dcc" => (
            &[
                "stages/core/src/dcc.rs",
                "stages/core/src/cluster.rs",
                "pipeline/model/src/method/dcc.rs",
            ],
            true,
        ),
        "cidec" => (
            &[
                "stages/core/src/cidec.rs",
                "stages/core/src/dcc.rs",
                "stages/core/src/cluster.rs",
                "pipeline/model/src/method/cidec.rs",
            ],
            true,
        ),
        "ensemble" => (
            &[
                "stages/core/src/ensemble.rs",
                "pipeline/model/src/method/ensemble.rs",
            ],
            false,
        ),
        "cluster" => (
            &[
                "stages/core/src/cluster.rs",
                "pipeline/model/src/stage/cluster.rs",
            ],
            false,
        ),
        "metrics" => (
            &[
                "stages/core/src/metrics.rs",
                "pipeline/model/src/stage/metrics.rs",
            ],
            false,
        ),
        "select" => (&["pipeline/model/src/stage/select.rs"], false),
        "table" => (
            &[
                "stages/report/src/lib.rs",
                "stages/report/src/text.rs",
                "stages/report/src/selection.rs",
                "stages/report/src/published.rs",
                "pipeline/model/src/targets/table.rs",
            ],
            false,
        ),
        "figure" => (
            &[
                "stages/report/src/figure.rs",
                "stages/report/src/histogram.rs",
                "stages/report/src/png.rs",
                "stages/report/src/sweep.rs",
                "pipeline/model/src/targets/figure.rs",
                "pipeline/model/src/targets/sweep.rs",
                "pipeline/model/src/targets/constraint_values.rs",
            ],
            false,
        ),
        _ => return None,
    })
}

/// Files whose digest reads as edited (`UPCC_TEST_CODE_EDIT`, for tests of what an edit does
/// without rebuilding).
static TEST_EDITS: OnceLock<Vec<String>> = OnceLock::new();

/// Treat `files` as edited: their digests change as an edit would change them.
pub fn set_test_edits(files: Vec<String>) {
    let _ = TEST_EDITS.set(files);
}

/// The blake3 (hex) of every embedded file, computed once.
fn digests() -> &'static BTreeMap<&'static str, String> {
    static D: OnceLock<BTreeMap<&'static str, String>> = OnceLock::new();
    D.get_or_init(|| {
        let edits = TEST_EDITS.get();
        SOURCES
            .iter()
            .map(|(path, bytes)| {
                let mut h = blake3::Hasher::new();
                h.update(bytes);
                if edits.is_some_and(|e| e.iter().any(|f| f == path)) {
                    h.update(b"\n// edited\n");
                }
                (*path, h.finalize().to_hex().to_string())
            })
            .collect()
    })
}

/// Whether `file` is one some stage names (for checking `UPCC_TEST_CODE_EDIT`).
pub fn is_stage_file(file: &str) -> bool {
    SOURCES.iter().any(|(p, _)| *p == file)
}

/// The code of a node of `stage` computing under numerics class `numerics`: each file → its
/// digest (empty for a stage that names none). Training stages add the network library and
/// the backend their class computes with; every stage adds the Parquet writer.
pub fn stage_code(stage: &str, numerics: &str) -> BTreeMap<String, String> {
    let Some((own, trains)) = own_files(stage) else {
        return BTreeMap::new();
    };
    let mut files: Vec<&str> = own.to_vec();
    files.push("stages/core/src/table.rs");
    if trains {
        files.extend_from_slice(NN);
        if numerics.starts_with("cuda") {
            files.extend(["stages/nn/src/cuda.rs", "stages/nn/src/cuda_kernels.cu"]);
        } else {
            files.push("stages/nn/src/cpu.rs");
        }
    }
    let d = digests();
    files
        .into_iter()
        .map(|f| {
            (
                f.to_string(),
                d.get(f).cloned().expect("every named file is embedded"),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_file_is_embedded_and_every_science_file_belongs_to_a_stage() {
        let stages = [
            "fetch",
            "features",
            "expert",
            "constraints",
            "pretrain",
            "train",
            "eci-pp",
            "dcc",
            "cidec",
            "ensemble",
            "cluster",
            "metrics",
            "select",
            "table",
            "figure",
        ];
        for s in stages {
            for n in ["cpu-f32-avx512", "cuda-f32-sm90"] {
                let code = stage_code(s, n);
                assert!(code.contains_key("stages/core/src/table.rs"), "{s}");
            }
        }
        // A new file of the science crates must be named by the stage it computes for.
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        let named: Vec<&str> = stages
            .iter()
            .flat_map(|s| {
                stage_code(s, "cpu")
                    .into_keys()
                    .chain(stage_code(s, "cuda").into_keys())
                    .collect::<Vec<_>>()
            })
            .map(|f| SOURCES.iter().find(|(p, _)| *p == f).unwrap().0)
            .collect();
        // Files that compute no stage's output bits: checks, errors, crate roots, tests, and
        // the gradient checker.
        let not_science = ["lib.rs", "error.rs", "check.rs", "gradcheck.rs", "tests.rs"];
        for dir in [
            "stages/core/src",
            "stages/core/src/features",
            "stages/nn/src",
        ] {
            for e in fs_err::read_dir(format!("{root}{dir}")).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if !(name.ends_with(".rs") || name.ends_with(".cu"))
                    || not_science.contains(&name.as_str())
                {
                    continue;
                }
                let path = format!("{dir}/{name}");
                assert!(
                    named.contains(&path.as_str()),
                    "`{path}` is named by no stage in pipeline/model/src/code.rs"
                );
            }
        }
    }

    #[test]
    fn a_training_stage_names_its_backend_and_not_the_other() {
        let cpu = stage_code("eci-pp", "cpu-f32-avx512");
        assert!(cpu.contains_key("stages/core/src/eci.rs"));
        assert!(cpu.contains_key("stages/nn/src/cpu.rs"));
        assert!(!cpu.contains_key("stages/nn/src/cuda.rs"));
        let gpu = stage_code("eci-pp", "cuda-f32-sm90-cc9.0");
        assert!(gpu.contains_key("stages/nn/src/cuda_kernels.cu"));
        assert!(!gpu.contains_key("stages/nn/src/cpu.rs"));
        assert!(!stage_code("metrics", "exact").contains_key("stages/nn/src/cpu.rs"));
        assert!(stage_code("unknown-stage", "exact").is_empty());
    }
}
