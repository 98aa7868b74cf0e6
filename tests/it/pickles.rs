//! The paper's feature datasets as their authors publish them, written here by Python's own
//! `pickle` and numpy's `np.save`: SpherePair's `(X, y)` tuples of the 512-d feature files (and
//! their `.part1`/`.part2` split), the Reuters subset's dict inside an object `.npy`, CIFAR-100's
//! fine labels mapped onto its superclasses, and a malicious pickle that must never run.
//!
//! Needs Python with numpy: `$UPCC_TEST_PYTHON` (CI sets it to a venv it creates, and then a
//! missing numpy is a failure), else `python3` when it imports numpy, else the test says so
//! and does nothing.

use std::path::Path;
use std::process::Command;

use upcc_stages::features::Features;

use crate::util::*;

/// A Python that imports numpy.
fn python() -> Option<String> {
    let works = |py: &str| {
        Command::new(py)
            .args(["-c", "import numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let Ok(py) = std::env::var("UPCC_TEST_PYTHON") {
        assert!(works(&py), "UPCC_TEST_PYTHON={py} cannot import numpy");
        return Some(py);
    }
    if works("python3") {
        return Some("python3".into());
    }
    eprintln!("skipped: no Python with numpy (set UPCC_TEST_PYTHON)");
    None
}

const WRITER: &str = r#"
import io, os, pickle, sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(0)
# SpherePair's feature files: pickle.dump((X, y)) with X float32 [N, 512], y int64.
X = rng.standard_normal((300, 512)).astype(np.float32)
y = np.arange(300, dtype=np.int64) % 10
blob = pickle.dumps((X, y))
open(os.path.join(out, "sp.pkl"), "wb").write(blob)
cut = len(blob) // 2 + 7
open(os.path.join(out, "sp.pkl.part1"), "wb").write(blob[:cut])
open(os.path.join(out, "sp.pkl.part2"), "wb").write(blob[cut:])
X.tofile(os.path.join(out, "sp.x.bin"))
y.astype("<i8").tofile(os.path.join(out, "sp.y.bin"))
# The Reuters subset: np.save of a dict {'data': float64 tf-idf, 'label': int}.
for name, n in (("train", 120), ("test", 40)):
    d = rng.random((n, 2000)) * (rng.random((n, 2000)) < 0.01)
    l = (np.arange(n) % 4).astype(np.int32)
    np.save(os.path.join(out, f"reuters_{name}.npy"), {"data": d, "label": l}, allow_pickle=True)
    d.astype(np.float32).tofile(os.path.join(out, f"reuters_{name}.x.bin"))
    l.astype("<i8").tofile(os.path.join(out, f"reuters_{name}.y.bin"))
# CIFAR-100 features with fine labels, every class present.
Xc = rng.standard_normal((400, 8)).astype(np.float32)
yc = np.arange(400, dtype=np.int64) % 100
open(os.path.join(out, "c100.pkl"), "wb").write(pickle.dumps((Xc, yc), protocol=5))
yc.astype("<i8").tofile(os.path.join(out, "c100.y.bin"))
# A pickle that runs a command when Python unpickles it.
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(out, "PWNED"),))
open(os.path.join(out, "evil.pkl"), "wb").write(pickle.dumps((Evil(), y)))
"#;

fn spec(datasets: &str) -> String {
    let s = TINY_SPEC.to_string();
    let d = s.find("datasets:").unwrap();
    let sup = s.find("supervision:").unwrap();
    let t = s.find("targets:").unwrap();
    format!(
        "{}datasets:\n{datasets}{}targets:\n  main:\n    grid: {{dataset: [data], supervision: [lv0.1], method: [probpair], pretrain: [false]}}\n",
        &s[..d],
        &s[sup..t]
    )
}

fn features(env: &Env) -> Features {
    let j = env.run_ok(&["stage=features"]);
    assert_eq!(j["failed"], 0, "{j}");
    let bytes = std::fs::read(output_path(env, "features/data", "features")).unwrap();
    Features::from_parquet(&bytes).unwrap()
}

fn f32s(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i64s(p: &Path) -> Vec<i64> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn pythons_own_pickles_load_bit_for_bit_and_code_never_runs() {
    let Some(py) = python() else { return };
    let env = Env::new();
    let dir = env.dir.path();
    let out = Command::new(&py)
        .args(["-c", WRITER])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // SpherePair's (X, y) tuple, as a whole file and joined from its two parts.
    env.write(
        "spec.yaml",
        &spec("  data:\n    format: pickle\n    files: {data: sp.pkl}\n    split: {kind: stratified, test_fraction: 0.2, seed: 0}\n    embedding_dim: 4\n"),
    );
    let f = features(&env);
    assert_eq!((f.rows(), f.dim, f.n_classes), (300, 512, 10));
    assert_eq!(
        bits(&f.x),
        bits(&f32s(&dir.join("sp.x.bin"))),
        "X bit for bit"
    );
    let labels: Vec<i64> = f.labels.iter().map(|&l| l as i64).collect();
    assert_eq!(labels, i64s(&dir.join("sp.y.bin")));
    let joined = [
        std::fs::read(dir.join("sp.pkl.part1")).unwrap(),
        std::fs::read(dir.join("sp.pkl.part2")).unwrap(),
    ]
    .concat();
    assert_eq!(joined, std::fs::read(dir.join("sp.pkl")).unwrap());

    // The Reuters subset: official train/test files, each a dict inside an object .npy; the
    // tf-idf values used as they are (float64 rounded to float32 as numpy's astype does).
    env.write(
        "spec.yaml",
        &spec("  data:\n    format: pickle\n    files: {train: reuters_train.npy, test: reuters_test.npy}\n    embedding_dim: 4\n"),
    );
    let f = features(&env);
    assert_eq!((f.rows(), f.dim, f.n_classes), (160, 2000, 4));
    let want = [
        f32s(&dir.join("reuters_train.x.bin")),
        f32s(&dir.join("reuters_test.x.bin")),
    ]
    .concat();
    assert_eq!(bits(&f.x), bits(&want), "tf-idf bit for bit");
    assert_eq!(f.test_indices(), (120..160).collect::<Vec<_>>());

    // CIFAR-100's fine labels onto its 20 superclasses (beaver 4 → aquatic mammals 0, aquarium
    // fish 1 → fish 1, maple tree 47 → trees 17).
    env.write(
        "spec.yaml",
        &spec("  data:\n    format: pickle\n    files: {data: c100.pkl}\n    labels: cifar100-coarse\n    split: {kind: stratified, test_fraction: 0.2, seed: 0}\n    embedding_dim: 4\n"),
    );
    let f = features(&env);
    assert_eq!(f.n_classes, 20);
    let fine = i64s(&dir.join("c100.y.bin"));
    for (i, &l) in fine.iter().enumerate() {
        let want = match l {
            4 => Some(0),
            1 => Some(1),
            47 => Some(17),
            _ => None,
        };
        if let Some(w) = want {
            assert_eq!(f.labels[i], w, "fine class {l}");
        }
    }

    // A pickle that would run a command: refused with what it references; nothing ran.
    env.write(
        "spec.yaml",
        &spec("  data:\n    format: pickle\n    files: {data: evil.pkl}\n    split: {kind: stratified, test_fraction: 0.2, seed: 0}\n    embedding_dim: 4\n"),
    );
    let r = env.upcc(&["run", &env.spec(), "stage=features", "--progress", "none"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains("`posix.system`, which upcc does not call")
            || r.stderr.contains("`os.system`, which upcc does not call"),
        "{r:?}"
    );
    assert!(!dir.join("PWNED").exists(), "pickle code ran");
}
