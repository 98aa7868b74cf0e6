//! Records the git revision and the versions of key libraries for provenance.
// A build script: its std::fs calls fail the build with cargo naming the script.
#![allow(clippy::disallowed_methods)]

use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=UPCC_GIT_REVISION={rev}");
    for p in [".git/HEAD", ".git/index"] {
        if std::path::Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let wanted = [
        "gemm",
        "parquet",
        "arrow-array",
        "polars",
        "blake3",
        "rayon",
        "safetensors",
        "rand_chacha",
        "serde_yaml_ng",
    ];
    let mut found = Vec::new();
    let mut name = String::new();
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = n.trim_matches('"').to_string();
        } else if let Some(v) = line.strip_prefix("version = ") {
            if wanted.contains(&name.as_str()) {
                found.push(format!("{name}={}", v.trim_matches('"')));
            }
        }
    }
    println!("cargo:rustc-env=UPCC_LIBRARIES={}", found.join(","));
}
