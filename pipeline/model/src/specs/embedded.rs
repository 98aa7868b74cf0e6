//! The data a spec may name without a file: the smoke spec and the vendored MNIST sample.

/// The embedded default spec (a copy of `experiments/smoke.yaml`).
pub const SMOKE_YAML: &str = include_str!("../../../../experiments/smoke.yaml");

/// The vendored MNIST sample (`embedded:mnist5k`).
pub const MNIST5K: &[u8] = include_bytes!("../../../../experiments/data/mnist5k.csv.gz");

/// Embedded datasets by name.
pub fn embedded(name: &str) -> Option<&'static [u8]> {
    match name {
        "mnist5k" => Some(MNIST5K),
        _ => None,
    }
}
