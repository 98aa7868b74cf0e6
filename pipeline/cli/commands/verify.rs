//! `upcc verify`: re-hash the store, quarantine what is corrupt, repair its layout.

use std::io::Write;
use std::path::PathBuf;

use super::context::*;
use upcc_model::error::Result;

pub fn verify(store_flag: &Option<PathBuf>) -> Result<i32> {
    let store = open_store(store_flag, false)?;
    let report = store.verify(|_, _| {})?;
    let mut o = std::io::stdout().lock();
    let _ = writeln!(
        o,
        "checked {} objects, {} manifests and {} refs in `{}`",
        report.objects_checked,
        report.manifests_checked,
        report.refs_checked,
        store.root().display()
    );
    for d in &report.corrupt_objects {
        let _ = writeln!(o, "corrupt object {d}: quarantined");
    }
    for k in &report.manifests_quarantined {
        let _ = writeln!(
            o,
            "result {k} is unreadable, misfiled or lost an output: quarantined (it will be recomputed)"
        );
    }
    for r in &report.refs_quarantined {
        let _ = writeln!(o, "ref {r} is unreadable: quarantined");
    }
    for m in &report.misplaced_moved {
        let _ = writeln!(
            o,
            "{m} was of the wrong kind (a file where a folder belongs, or a folder where a file does): moved to quarantine"
        );
    }
    if report.stale_temp_files_removed > 0 {
        let _ = writeln!(
            o,
            "removed {} temporary files left by interrupted runs",
            report.stale_temp_files_removed
        );
    }
    for (signer, n) in &report.untrusted {
        let _ = writeln!(
            o,
            "{n} intact result{} signed by {signer}, a key this store's trust policy does not list: kept, not served (`run` computes them again)",
            if *n == 1 { "" } else { "s" }
        );
    }
    if report.is_clean() {
        let _ = writeln!(o, "store is intact");
        Ok(0)
    } else {
        eprintln!("error: the store had corrupt data; it was quarantined under `{}` and will be recomputed by the next run", store.root().join("quarantine").display());
        Ok(1)
    }
}
