//! Parameter checks: every settings type has one [`Check::check`] that returns all of its
//! problems. The spec loader calls them before anything runs (placing each problem at its file
//! and line, or at the `--set` argument that gave the value); every stage calls them again
//! when it starts, so a stage never trains on a value it would reject.
//!
//! Also here: the memory a network of given sizes needs, so that absurd sizes are refused by
//! name instead of aborting the process on a failed allocation.

use crate::error::StageError;

/// One problem with a parameter: its field (dotted, relative to the settings' section) and
/// what is wrong with it, in words that say what is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl Problem {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Settings that can say what is wrong with them.
pub trait Check {
    fn check(&self) -> Vec<Problem>;
}

/// All problems of a section as one input error (`section.field: message; …`): what a stage
/// reports if it is handed settings the spec loader would have refused.
pub fn require(section: &str, problems: Vec<Problem>) -> Result<(), StageError> {
    if problems.is_empty() {
        return Ok(());
    }
    Err(StageError::Params {
        section: section.to_string(),
        problems,
    })
}

/// A collector with the usual rules.
#[derive(Default)]
pub struct Checker {
    pub problems: Vec<Problem>,
}

impl Checker {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push(Problem::new(field, message));
    }

    /// An integer that must be at least `min`.
    pub fn at_least(&mut self, field: &str, v: usize, min: usize) {
        if v < min {
            self.push(field, format!("must be at least {min}, got {v}"));
        }
    }

    /// A finite number > 0.
    pub fn positive(&mut self, field: &str, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            self.push(field, format!("must be a finite number > 0, got {v}"));
        }
    }

    /// A finite number ≥ 0.
    pub fn non_negative(&mut self, field: &str, v: f64) {
        if !(v.is_finite() && v >= 0.0) {
            self.push(field, format!("must be a finite number ≥ 0, got {v}"));
        }
    }

    /// A number in [lo, hi) (`closed_hi`: [lo, hi]).
    pub fn in_range(&mut self, field: &str, v: f64, lo: f64, hi: f64, closed_hi: bool) {
        let ok = v.is_finite() && v >= lo && if closed_hi { v <= hi } else { v < hi };
        if !ok {
            let close = if closed_hi { "]" } else { ")" };
            self.push(field, format!("must be in [{lo}, {hi}{close}, got {v}"));
        }
    }

    /// Layer sizes: each at least 1 (`allow_empty`: the list may be empty).
    pub fn sizes(&mut self, field: &str, v: &[usize], allow_empty: bool) {
        if !allow_empty && v.is_empty() {
            self.push(field, "needs at least one layer size");
        }
        if let Some(i) = v.iter().position(|&h| h == 0) {
            self.push(
                &format!("{field}[{i}]"),
                "a layer of 0 units; every size must be at least 1",
            );
        }
    }

    pub fn done(self) -> Vec<Problem> {
        self.problems
    }
}

/// Bytes one dense network of `dims` (input, hidden…, output) needs to train: weights and
/// biases with their gradients and two Adam moments (4 f32 copies), saturating.
pub fn mlp_training_bytes(dims: &[usize]) -> u128 {
    dims.windows(2)
        .map(|w| (w[0] as u128) * (w[1] as u128) + w[1] as u128)
        .sum::<u128>()
        * 16
}

/// Bytes an autoencoder `input → hidden… → embedding` with its mirror decoder needs to train.
pub fn autoencoder_training_bytes(input: usize, hidden: &[usize], embedding: usize) -> u128 {
    let mut dims = vec![input];
    dims.extend_from_slice(hidden);
    dims.push(embedding);
    2 * mlp_training_bytes(&dims)
}

/// Physical memory of this machine in bytes (`/proc/meminfo`), if known.
pub fn machine_memory_bytes() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u128 = text
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A problem if `bytes` for `what` exceed this machine's memory.
pub fn fits_in_memory(field: &str, what: &str, bytes: u128) -> Option<Problem> {
    let total = machine_memory_bytes()?;
    (bytes > total).then(|| {
        Problem::new(
            field,
            format!(
                "{what} would need {} of memory to train, more than this machine's {}; lower it",
                human_bytes(bytes),
                human_bytes(total)
            ),
        )
    })
}

pub fn human_bytes(b: u128) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checker_names_each_bad_field() {
        let mut c = Checker::new();
        c.at_least("epochs", 0, 1);
        c.positive("lr", f64::NAN);
        c.positive("ok", 0.1);
        c.non_negative("lambda", -1.0);
        c.in_range("dropout", 1.0, 0.0, 1.0, false);
        c.in_range("corruption", 1.0, 0.0, 1.0, true);
        c.sizes("hidden", &[16, 0], false);
        let p = c.done();
        let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["epochs", "lr", "lambda", "dropout", "hidden[1]"]);
        assert!(p[1].message.contains("NaN"), "{:?}", p[1]);
        let e = require("train", p).unwrap_err().to_string();
        assert!(
            e.starts_with("`train.epochs`: must be at least 1, got 0;"),
            "{e}"
        );
    }

    #[test]
    fn memory_estimates_saturate_instead_of_overflowing() {
        // 784-500 + biases, × 16 bytes.
        assert_eq!(mlp_training_bytes(&[784, 500]), (784 * 500 + 500) * 16);
        let huge = autoencoder_training_bytes(784, &[2_000_000_000], 1_000_000_000);
        assert!(huge > 1u128 << 60);
        assert!(fits_in_memory("hidden", "this network", huge).is_some());
        assert!(fits_in_memory("hidden", "this network", 1024).is_none());
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
