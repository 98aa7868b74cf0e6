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

/// Every file under `dir` (recursively).
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn bad_refs_never_wedge_the_store() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let refs = files_under(&env.store().join("refs"));
    assert!(refs.len() >= 4, "{refs:?}");
    // Truncated, empty, garbage and a flipped first byte.
    let text = std::fs::read(&refs[0]).unwrap();
    std::fs::write(&refs[0], &text[..text.len() / 2]).unwrap();
    std::fs::write(&refs[1], b"").unwrap();
    std::fs::write(&refs[2], b"\x00\xffnot json at all").unwrap();
    let mut t3 = std::fs::read(&refs[3]).unwrap();
    t3[0] ^= 0x40;
    std::fs::write(&refs[3], t3).unwrap();
    // status reads refs (why is it stale): it heals them, one warning each, and succeeds.
    let s = env.upcc(&["status", &spec]);
    assert_eq!(s.code, 0, "{s:?}");
    assert_eq!(s.stderr.matches("upcc: warning:").count(), 4, "{s:?}");
    assert!(s.stderr.contains("moved to quarantine"), "{s:?}");
    for r in &refs[..4] {
        assert!(!r.exists(), "{} quarantined", r.display());
    }
    // run, gc and verify all work; nothing is recomputed (refs only explain staleness).
    let r = env.run_ok(&[]);
    assert_eq!(r["executed"], 0, "{r}");
    assert_eq!(env.upcc(&["gc", &spec, "--dry-run"]).code, 0);
    assert_eq!(env.upcc(&["verify"]).code, 0);
    // verify checks refs itself.
    let again = files_under(&env.store().join("refs"));
    std::fs::write(&again[0], b"{").unwrap();
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 1, "{v:?}");
    assert!(v.stdout.contains("is unreadable: quarantined"), "{v:?}");
    assert_eq!(env.upcc(&["verify"]).code, 0);
}

#[test]
fn an_unparsable_manifest_reads_as_missing_and_is_recomputed() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let m = manifest(&env, &spec, "cluster/blobs/lv0.1/probpair/pre/t1", &[]);
    let key = m["key"].as_str().unwrap().to_string();
    let path = env
        .store()
        .join("nodes")
        .join(&key[..2])
        .join(format!("{}.json", &key[2..]));
    std::fs::write(&path, b"{\"manifest_schema\": 1, \"key\"").unwrap();
    let s = env.upcc(&["status", &spec, "--json"]);
    assert_eq!(s.code, 0, "{s:?}");
    assert!(s.stderr.contains("unreadable"), "{s:?}");
    let r = env.run_ok(&[]);
    assert_eq!(
        ids_with(&r, "executed"),
        ["cluster/blobs/lv0.1/probpair/pre/t1"],
        "only the node that lost its manifest: {r}"
    );
    assert_eq!(env.upcc(&["verify"]).code, 0);
}

#[test]
fn verify_checks_that_key_material_hashes_to_the_key() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let m = manifest(&env, &spec, "metrics/blobs/lv0.1/probpair/pre/t1", &[]);
    let key = m["key"].as_str().unwrap().to_string();
    let path = env
        .store()
        .join("nodes")
        .join(&key[..2])
        .join(format!("{}.json", &key[2..]));
    // A parseable manifest whose recorded material no longer matches its key.
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replacen("\"stage_version\": 2", "\"stage_version\": 7", 1);
    assert_ne!(text, edited);
    std::fs::write(&path, edited).unwrap();
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 1, "{v:?}");
    assert!(v.stdout.contains(&key), "{v:?}");
    let r = env.run_ok(&[]);
    assert_eq!(
        ids_with(&r, "executed"),
        ["metrics/blobs/lv0.1/probpair/pre/t1"]
    );
}

#[test]
fn a_corrupt_object_read_only_to_print_a_table_is_recomputed() {
    let env = Env::new();
    let first = env.run_ok(&[]);
    let metrics = output_path(&env, "metrics/blobs/lv0.1/probpair/pre/t1", "metrics");
    flip(&metrics);
    let spec = env.spec();
    let r = env.upcc(&["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("quarantined"), "{r:?}");
    let j = r.json();
    assert_eq!(
        ids_with(&j, "executed"),
        ["metrics/blobs/lv0.1/probpair/pre/t1"],
        "{j}"
    );
    assert_eq!(j["tables"], first["tables"], "the same table");
    assert_eq!(env.upcc(&["verify"]).code, 0);
}

#[test]
fn a_store_killed_while_writing_store_json_is_accepted() {
    let env = Env::new();
    let store = env.store();
    // What a kill before STORE.json's rename leaves: the folders and a temp file.
    for d in [
        "objects",
        "nodes",
        "refs",
        "logs",
        "locks",
        "tmp",
        "quarantine",
    ] {
        std::fs::create_dir_all(store.join(d)).unwrap();
    }
    std::fs::write(store.join("tmp/STORE.json.host.1.tmp"), b"{\"layo").unwrap();
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 0, "{v:?}");
    assert!(v.stderr.contains("interrupted"), "{v:?}");
    assert!(store.join("STORE.json").exists());
    let spec = env.spec();
    assert_eq!(env.upcc(&["gc", &spec, "--dry-run"]).code, 0);
    env.run_ok(&[]);
    // A folder with other content is still not taken for a store.
    let other = env.path("not-a-store");
    std::fs::create_dir_all(other.join("objects")).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let r = env.upcc_store(&other, &["verify"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(!other.join("STORE.json").exists());
}

#[test]
fn a_damaged_store_json_is_written_again_from_the_folders() {
    let env = Env::new();
    env.run_ok(&[]);
    let info = env.store().join("STORE.json");
    let original = std::fs::read(&info).unwrap();
    for damage in [&original[..10], b"", b"\x00\xff garbage"] {
        std::fs::write(&info, damage).unwrap();
        let v = env.upcc(&["verify"]);
        assert_eq!(v.code, 0, "{v:?}");
        assert!(v.stderr.contains("was written again"), "{v:?}");
        assert_eq!(std::fs::read(&info).unwrap(), original);
    }
    // Missing: `run` (and every command) says so instead of recreating it silently.
    std::fs::remove_file(&info).unwrap();
    let spec = env.spec();
    let r = env.upcc(&["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("is missing"), "{r:?}");
    assert_eq!(r.json()["executed"], 0, "nothing recomputed: {r:?}");
    assert_eq!(std::fs::read(&info).unwrap(), original);
    let moved = files_under(&env.store().join("quarantine"))
        .iter()
        .filter(|p| p.to_string_lossy().contains("store-info"))
        .count();
    assert_eq!(moved, 3, "each damaged STORE.json kept in quarantine");
    // A folder that has a garbage STORE.json but none of the store's folders: not rewritten,
    // and the message says what to do.
    let other = env.path("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("STORE.json"), b"{\"lay").unwrap();
    let v = env.upcc_store(&other, &["verify"]);
    assert_eq!(v.code, 1, "{v:?}");
    assert!(v.stderr.contains("delete `STORE.json`"), "{v:?}");
}

#[test]
fn paths_of_the_wrong_kind_are_moved_aside_not_wedging_the_store() {
    let env = Env::new();
    env.run_ok(&[]);
    let spec = env.spec();
    let store = env.store();
    // A ref replaced by a directory, a lock by a directory, `locks/` and `quarantine/` by files.
    let refs = files_under(&store.join("refs"));
    std::fs::remove_file(&refs[0]).unwrap();
    std::fs::create_dir(&refs[0]).unwrap();
    std::fs::remove_dir_all(store.join("quarantine")).unwrap();
    std::fs::write(store.join("quarantine"), b"not a folder").unwrap();
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 1, "verify reports what it moved: {v:?}");
    assert!(
        v.stdout.contains("quarantine was of the wrong kind"),
        "{v:?}"
    );
    assert!(
        v.stdout.contains("is unreadable: quarantined"),
        "the ref: {v:?}"
    );
    assert!(store.join("quarantine").is_dir());
    assert_eq!(env.upcc(&["verify"]).code, 0, "then intact");
    std::fs::remove_dir_all(store.join("locks")).unwrap();
    std::fs::write(store.join("locks"), b"not a folder").unwrap();
    let r = env.run_ok(&["--force", "stage=features"]);
    assert_eq!(r["failed"], 0, "{r}");
    assert!(store.join("locks").is_dir());
    // A node's lock path taken by a directory: moved aside when the node runs.
    let lock_dirs: Vec<_> = files_under(&store.join("locks"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "lock"))
        .collect();
    assert!(!lock_dirs.is_empty());
    std::fs::remove_file(&lock_dirs[0]).unwrap();
    std::fs::create_dir(&lock_dirs[0]).unwrap();
    let r = env.upcc(&["run", &spec, "--force", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("was a directory where the store keeps a file"),
        "{r:?}"
    );
    assert_eq!(env.upcc(&["verify"]).code, 0);
}

#[test]
fn a_manifest_edited_to_list_another_object_is_not_served() {
    let env = Env::new();
    let first = env.run_ok(&[]);
    let spec = env.spec();
    // Point one cell's metrics at another cell's metrics object (valid JSON, a real digest).
    let a = manifest(&env, &spec, "metrics/blobs/lv0.1/probpair/pre/t1", &[]);
    let b = manifest(&env, &spec, "metrics/blobs/lv0.1/probpair/nopre/t1", &[]);
    let (da, db) = (
        a["outputs"]["metrics"]["digest"]
            .as_str()
            .unwrap()
            .to_string(),
        b["outputs"]["metrics"]["digest"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    assert_ne!(da, db);
    let key = a["key"].as_str().unwrap().to_string();
    let path = env
        .store()
        .join("nodes")
        .join(&key[..2])
        .join(format!("{}.json", &key[2..]));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"seal\""), "manifests are sealed");
    let size_a = a["outputs"]["metrics"]["bytes"].to_string();
    let size_b = b["outputs"]["metrics"]["bytes"].to_string();
    let edited = text.replace(&da, &db).replace(
        &format!("\"bytes\": {size_a}"),
        &format!("\"bytes\": {size_b}"),
    );
    std::fs::write(&path, edited).unwrap();
    let v = env.upcc(&["verify"]);
    assert_eq!(v.code, 1, "{v:?}");
    assert!(v.stdout.contains(&key), "{v:?}");
    // The next run recomputes that cell's metrics and prints the right table.
    let r = env.run_ok(&[]);
    assert_eq!(
        ids_with(&r, "executed"),
        ["metrics/blobs/lv0.1/probpair/pre/t1"]
    );
    assert_eq!(r["tables"], first["tables"]);
    // And `run` itself never serves an edited manifest, verify or not.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(&da, &db)).unwrap();
    let r = env.upcc(&["run", &spec, "--json", "--progress", "none"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("not the ones it was sealed with"),
        "{r:?}"
    );
    assert_eq!(r.json()["tables"], first["tables"]);
}
