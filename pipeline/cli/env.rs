//! The `UPCC_*` environment variables: every one upcc reads at run time, read here and only
//! here, one way. A variable that is set but unusable is an error naming it (exit 2 before
//! anything runs), never silently replaced by the default. Those that stand in for flags
//! ([`FLAG_VARS`]) are read by clap with their flags; the engine reads its lease timings
//! itself (it knows nothing of this crate), and [`check`] vets them first.

use std::path::PathBuf;

use upcc_model::error::{Error, Result};

/// The variables that stand in for flags (clap reads them), with their flags.
pub const FLAG_VARS: [(&str, &str); 6] = [
    ("UPCC_THREADS", "--threads"),
    ("UPCC_NODE_THREADS", "--node-threads"),
    ("UPCC_EXECUTOR", "--executor"),
    ("UPCC_GPUS", "--gpus"),
    ("UPCC_NUMERICS", "--numerics"),
    ("UPCC_KEEP_CODE_CHANGES", "--keep-code-changes"),
];

/// The store (`--store` wins): `$UPCC_STORE`, any path.
pub fn store() -> Option<PathBuf> {
    std::env::var_os("UPCC_STORE").map(PathBuf::from)
}

/// Whether a new store is made group-shared: `$UPCC_STORE_SHARED=1` ([`check`] refuses other
/// values than 1, 0 and empty).
pub fn store_shared() -> bool {
    std::env::var_os("UPCC_STORE_SHARED").is_some_and(|v| v == "1")
}

/// The training device (`--device` wins): `$UPCC_DEVICE` (UTF-8, vetted by [`check`]).
pub fn device() -> Option<String> {
    std::env::var_os("UPCC_DEVICE").map(|v| v.to_string_lossy().into_owned())
}

/// The CPU threads of `upcc job` (which has no `--threads`): `$UPCC_THREADS`, a whole number
/// ≥ 1 (vetted by [`check`]).
pub fn threads() -> Option<usize> {
    std::env::var("UPCC_THREADS")
        .ok()
        .and_then(|t| t.trim().parse::<usize>().ok())
        .filter(|&t| t >= 1)
}

/// The Slurm job this process runs in: `$SLURM_JOB_ID` (set by Slurm in every job).
pub fn slurm_job_id() -> Option<String> {
    std::env::var("SLURM_JOB_ID").ok().filter(|j| !j.is_empty())
}

/// The user config file: `$UPCC_CONFIG`.
pub fn config() -> Option<PathBuf> {
    std::env::var_os("UPCC_CONFIG").map(PathBuf::from)
}

/// The remote cache (`--remote` wins; the spec's and user config's `remote:` lose):
/// `$UPCC_REMOTE`, a URL or `off`.
pub fn remote() -> Option<String> {
    std::env::var_os("UPCC_REMOTE").map(|v| v.to_string_lossy().into_owned())
}

/// The key file that signs the results this user computes: `$UPCC_SIGNING_KEY`.
pub fn signing_key() -> Option<PathBuf> {
    std::env::var_os("UPCC_SIGNING_KEY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Public keys trusted besides the user config's: `$UPCC_TRUSTED_KEYS`.
pub fn trusted_keys() -> Option<String> {
    std::env::var_os("UPCC_TRUSTED_KEYS").map(|v| v.to_string_lossy().into_owned())
}

/// A folder of dataset files put there by hand (for offline machines): `$UPCC_DATA_MIRROR`.
pub fn data_mirror() -> Option<PathBuf> {
    std::env::var_os("UPCC_DATA_MIRROR").map(PathBuf::from)
}

/// A depth block for the CPU's products other than the pinned one, for measuring how far
/// rounding alone moves a result: `$UPCC_TEST_K_BLOCK`, 1..=512 (vetted by [`check`]; the
/// numerics class names it).
pub fn test_k_block() -> Option<usize> {
    std::env::var("UPCC_TEST_K_BLOCK")
        .ok()
        .and_then(|t| t.trim().parse::<usize>().ok())
        .filter(|kb| (1..=upcc_nn::cpu::K_BLOCK).contains(kb))
}

/// `UPCC_TEST_CODE_EDIT=FILE[,FILE…]`: stage source files to treat as edited (their digests
/// change as an edit would), so tests see what editing a stage does without a rebuild.
pub fn test_code_edits() -> Option<Vec<String>> {
    std::env::var("UPCC_TEST_CODE_EDIT").ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

/// The `UPCC_*` variables upcc reads itself (not through clap): a value it cannot use is an
/// error naming the variable, never silently replaced by the default.
pub fn check() -> Result<()> {
    let bad = |var: &str, value: &str, want: &str| {
        Error::user(format!(
            "environment variable {var}=`{value}` is not valid: it must be {want}"
        ))
        .hint(format!("fix it or unset it (`unset {var}`)"))
    };
    for var in ["UPCC_LEASE_HEARTBEAT_S", "UPCC_LEASE_EXPIRY_S"] {
        if let Some(v) = std::env::var_os(var) {
            let v = v.to_string_lossy();
            if !v
                .trim()
                .parse::<f64>()
                .is_ok_and(|s| s.is_finite() && s > 0.0)
            {
                return Err(bad(var, &v, "a number of seconds > 0"));
            }
        }
    }
    if let Some(v) = std::env::var_os("UPCC_STORE_SHARED") {
        let v = v.to_string_lossy();
        if !["", "0", "1"].contains(&v.as_ref()) {
            return Err(bad(
                "UPCC_STORE_SHARED",
                &v,
                "1 (a group-shared store) or 0",
            ));
        }
    }
    if let Some(v) = std::env::var_os("UPCC_THREADS") {
        let v = v.to_string_lossy();
        if threads().is_none() {
            return Err(bad("UPCC_THREADS", &v, "a whole number of threads ≥ 1"));
        }
    }
    if let Some(v) = std::env::var_os("UPCC_REMOTE") {
        if v.to_str().is_none() {
            return Err(bad(
                "UPCC_REMOTE",
                &v.to_string_lossy(),
                "a URL (s3://, gs://, az://, file://) or off",
            ));
        }
    }
    if let Some(v) = std::env::var_os("UPCC_TEST_K_BLOCK") {
        if test_k_block().is_none() {
            return Err(bad(
                "UPCC_TEST_K_BLOCK",
                &v.to_string_lossy(),
                &format!("a depth block of 1 to {}", upcc_nn::cpu::K_BLOCK),
            ));
        }
    }
    if let Some(files) = test_code_edits() {
        if let Some(f) = files.iter().find(|f| !upcc_model::code::is_stage_file(f)) {
            return Err(bad(
                "UPCC_TEST_CODE_EDIT",
                f,
                "stage source files (paths from the repository root, e.g. stages/core/src/cluster.rs)",
            ));
        }
    }
    if let Some(v) = std::env::var_os("UPCC_DEVICE") {
        if v.to_str().is_none() {
            return Err(bad(
                "UPCC_DEVICE",
                &v.to_string_lossy(),
                "auto, cpu, cuda or cuda:N",
            ));
        }
    }
    Ok(())
}
