//! A flipped byte is reported by `verify`, quarantined and never served.

use std::os::unix::fs::PermissionsExt;

use crate::util::*;

fn flip(path: &std::path::Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn flipped_byte_is_reported_by_verify_and_recomputed() {
    let env = Env::new();
    env.run_ok(&[]);
    let object = output_path(&env, "train/blobs/lv0.1/probpair/pre/t1", "embeddings");
    flip(&object);
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 1, "{v:?}");
    let digest = format!(
        "{}{}",
        object
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap(),
        object.file_name().unwrap().to_str().unwrap()
    );
    assert!(
        v.stdout.contains(&format!("corrupt object {digest}")),
        "{v:?}"
    );
    assert!(!object.exists(), "the corrupt object is quarantined");
    // The node that lost its output is recomputed, nothing else; the result is the same.
    let r = env.run_ok(&[]);
    assert_eq!(
        ids_with(&r, "executed"),
        ["train/blobs/lv0.1/probpair/pre/t1"]
    );
    assert!(object.exists());
    assert_eq!(env.upcc(&["verify"]).code, 0);
}

#[test]
fn corrupt_input_is_never_served_to_a_consumer() {
    let env = Env::new();
    env.run_ok(&[]);
    flip(&output_path(&env, "features/blobs", "features"));
    // The experts must rerun (new parameter) and read the corrupt features: the engine
    // quarantines it, recomputes `features`, then runs the experts on intact bytes.
    let spec = env.spec();
    let r = env.upcc(&[
        "run",
        &spec,
        "--json",
        "--progress",
        "plain",
        "--set",
        "expert.max_epochs=21",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("corrupt object"), "{r:?}");
    let j = r.json();
    assert!(
        ids_with(&j, "executed").contains(&"features/blobs".to_string()),
        "{j}"
    );
    assert_eq!(env.upcc(&["verify"]).code, 0);
}
