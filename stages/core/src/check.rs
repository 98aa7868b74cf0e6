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

/// The most epochs any schedule may ask for.
pub const MAX_EPOCHS: usize = 100_000;

/// The largest learning rate accepted.
pub const MAX_LR: f64 = 10.0;

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

    /// A number of epochs: at least `min`, at most [`MAX_EPOCHS`] (more is a typo: the
    /// paper's longest schedule is 500 epochs).
    pub fn epochs(&mut self, field: &str, v: usize, min: usize) {
        if v < min || v > MAX_EPOCHS {
            self.push(
                field,
                format!("must be {min} to {MAX_EPOCHS} epochs, got {v}"),
            );
        }
    }

    /// A learning rate: a finite number > 0 and at most [`MAX_LR`] (the paper's are 1e-4 to
    /// 0.5; larger ones diverge at once).
    pub fn learning_rate(&mut self, field: &str, v: f64) {
        if !(v.is_finite() && v > 0.0 && v <= MAX_LR) {
            self.push(
                field,
                format!("must be a learning rate > 0 and ≤ {MAX_LR}, got {v}"),
            );
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

/// Bytes one dense network of `dims` (input, hidden…, output) needs to train on batches of
/// `rows` rows: its weights and biases with their gradients and two Adam moments (4 f32
/// copies), and per step every layer's activations with their gradients, which the graph
/// keeps, plus its pooled temporaries (counted three times over, f32); saturating.
pub fn net_bytes(dims: &[usize], rows: usize) -> u128 {
    let params: u128 = dims
        .windows(2)
        .map(|w| (w[0] as u128).saturating_mul(w[1] as u128) + w[1] as u128)
        .fold(0u128, |a, b| a.saturating_add(b));
    let units: u128 = dims.iter().map(|&d| d as u128).sum();
    params
        .saturating_mul(16)
        .saturating_add(units.saturating_mul(rows as u128).saturating_mul(12))
}

/// Bytes of a `rows` × `cols` f32 matrix, saturating.
pub fn f32_bytes(rows: usize, cols: usize) -> u128 {
    (rows as u128)
        .saturating_mul(cols as u128)
        .saturating_mul(4)
}

/// Bytes one dense network of `dims` needs to train, weights and optimiser state only.
pub fn mlp_training_bytes(dims: &[usize]) -> u128 {
    net_bytes(dims, 0)
}

/// Bytes an autoencoder `input → hidden… → embedding` with its mirror decoder needs to train
/// on batches of `rows` rows.
pub fn autoencoder_bytes(input: usize, hidden: &[usize], embedding: usize, rows: usize) -> u128 {
    let mut dims = vec![input];
    dims.extend_from_slice(hidden);
    dims.push(embedding);
    let enc = net_bytes(&dims, rows);
    dims.reverse();
    enc.saturating_add(net_bytes(&dims, rows))
}

/// Bytes of an autoencoder's weights and optimiser state only.
pub fn autoencoder_training_bytes(input: usize, hidden: &[usize], embedding: usize) -> u128 {
    autoencoder_bytes(input, hidden, embedding, 0)
}

/// Physical memory of this machine in bytes (`/proc/meminfo`), if known.
pub fn machine_memory_bytes() -> Option<u128> {
    meminfo("MemTotal:")
}

fn meminfo(field: &str) -> Option<u128> {
    kb_field("/proc/meminfo", field)
}

/// A `Field:  N kB` line of a /proc file, in bytes.
fn kb_field(file: &str, field: &str) -> Option<u128> {
    let text = fs_err::read_to_string(file).ok()?;
    let kb: u128 = text
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The memory this process may use, and what sets it: the smaller of the machine's physical
/// memory, the address-space limit left (`ulimit -v`, less what the process maps already) and
/// the cgroup's memory limit left (`memory.max` less `memory.current`, a container's or a
/// Slurm job's).
pub fn memory_budget() -> Option<(u128, String)> {
    let mut best: Option<(u128, String)> = None;
    let mut consider = |bytes: u128, what: String| {
        if best.as_ref().is_none_or(|(b, _)| bytes < *b) {
            best = Some((bytes, what));
        }
    };
    if let Some(total) = machine_memory_bytes() {
        consider(total, format!("this machine's {}", human_bytes(total)));
    }
    if let Some(limit) = address_space_limit() {
        let used = proc_status_bytes("VmSize:").unwrap_or(0);
        consider(
            limit.saturating_sub(used),
            format!(
                "the {} left under this process's address-space limit (ulimit -v {})",
                human_bytes(limit.saturating_sub(used)),
                human_bytes(limit)
            ),
        );
    }
    if let Some((limit, current)) = cgroup_memory() {
        consider(
            limit.saturating_sub(current),
            format!(
                "the {} left under this process's cgroup memory limit ({})",
                human_bytes(limit.saturating_sub(current)),
                human_bytes(limit)
            ),
        );
    }
    best
}

fn address_space_limit() -> Option<u128> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes one struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(r.rlim_cur as u128)
}

fn proc_status_bytes(field: &str) -> Option<u128> {
    kb_field("/proc/self/status", field)
}

/// The cgroup memory limit of this process and its current use (v2, else v1), if limited.
fn cgroup_memory() -> Option<(u128, u128)> {
    let own = fs_err::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroup_memory_in(
        &own,
        std::path::Path::new("/sys/fs/cgroup"),
        std::path::Path::new("/sys/fs/cgroup/memory"),
    )
}

/// [`cgroup_memory`] over `/proc/self/cgroup`'s text and the v2 and v1 (memory controller)
/// mount points: the process's own group and every parent up to the mount, the limit that
/// leaves the least (a Slurm job's limit sits on the job's group, above the step's and the
/// task's, which say `max`). A group path that does not exist under the mount (a container's
/// namespaced view) reads from the mount itself.
fn cgroup_memory_in(
    own: &str,
    v2_root: &std::path::Path,
    v1_root: &std::path::Path,
) -> Option<(u128, u128)> {
    let read = |p: &std::path::Path| fs_err::read_to_string(p).ok().map(|s| s.trim().to_string());
    // The tightest (limit, current) over the group and its parents.
    let walk = |root: &std::path::Path, group: &str, max_file: &str, cur_file: &str| {
        let mut dir = root.join(group.trim_start_matches('/'));
        if !dir.is_dir() {
            dir = root.to_path_buf();
        }
        let mut best: Option<(u128, u128)> = None;
        loop {
            let limit = read(&dir.join(max_file)).and_then(|m| m.parse::<u128>().ok());
            if let Some(limit) = limit.filter(|&l| l < 1 << 60) {
                let current = read(&dir.join(cur_file))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let left = |(l, c): (u128, u128)| l.saturating_sub(c);
                if best.is_none_or(|b| left((limit, current)) < left(b)) {
                    best = Some((limit, current));
                }
            }
            if dir == root {
                break;
            }
            match dir.parent() {
                Some(p) if p.starts_with(root) => dir = p.to_path_buf(),
                _ => break,
            }
        }
        best
    };
    // v2: one line `0::/path`.
    if let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) {
        if v2_root.join("cgroup.controllers").exists()
            || v2_root
                .join(path.trim_start_matches('/'))
                .join("memory.max")
                .exists()
        {
            return walk(v2_root, path, "memory.max", "memory.current");
        }
    }
    // v1: the memory controller's line `N:memory:/path` (controllers may be joined by commas).
    let path = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',').any(|c| c == "memory").then_some(path)
    })?;
    walk(
        v1_root,
        path,
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
    )
}

/// A problem if `bytes` for `what` exceed the memory this process may use.
pub fn fits_in_memory(field: &str, what: &str, bytes: u128) -> Option<Problem> {
    let (budget, source) = memory_budget()?;
    (bytes > budget).then(|| {
        Problem::new(
            field,
            format!(
                "{what} would need {} of memory to train, more than {source}; lower it",
                human_bytes(bytes)
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
    fn epochs_and_learning_rates_have_plausible_bounds() {
        let mut c = Checker::new();
        c.epochs("epochs", usize::MAX, 1);
        c.epochs("finetune_epochs", 0, 0);
        c.epochs("max_epochs", MAX_EPOCHS, 1);
        c.learning_rate("lr", 1e308);
        c.learning_rate("b_lr", 0.5);
        let p = c.done();
        let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["epochs", "lr"]);
        assert!(p[0].message.contains("1 to 100000"), "{:?}", p[0]);
        assert!(p[1].message.contains("≤ 10"), "{:?}", p[1]);
    }

    #[test]
    fn the_memory_model_counts_activations_at_the_batch_size() {
        // The paper's MNIST autoencoder: 784-500-500-2000-10 and its mirror.
        let weights = autoencoder_training_bytes(784, &[500, 500, 2000], 10);
        let params: u128 = 2 * (784 * 500 + 500 * 500 + 500 * 2000 + 2000 * 10)
            + (500 + 500 + 2000 + 10)
            + (2000 + 500 + 500 + 784);
        assert_eq!(weights, params * 16);
        // A batch of 256 rows adds every layer's activations and gradients (3 f32 each), both
        // networks: (784 + 500 + 500 + 2000 + 10) units × 2 × 256 rows × 12 bytes.
        let with_batch = autoencoder_bytes(784, &[500, 500, 2000], 10, 256);
        assert_eq!(with_batch - weights, 3794 * 2 * 256 * 12);
        assert!(net_bytes(&[8, 16, 4], 10) > net_bytes(&[8, 16, 4], 1));
        assert_eq!(f32_bytes(1000, 784), 3_136_000);
    }

    #[test]
    fn the_memory_budget_is_the_smallest_limit() {
        let (bytes, source) = memory_budget().expect("Linux reports its memory");
        assert!(bytes <= machine_memory_bytes().unwrap(), "{source}");
        assert!(!source.is_empty());
    }

    #[test]
    fn the_cgroup_limit_is_the_own_groups_or_a_parents_whichever_leaves_least() {
        let dir = tempfile::tempdir().unwrap();
        let w = |p: &str, v: &str| {
            let p = dir.path().join(p);
            fs_err::create_dir_all(p.parent().unwrap()).unwrap();
            fs_err::write(p, v).unwrap();
        };
        // v2: the job's group limits (4 GiB, 1 GiB used), the step and task below say `max`.
        w("v2/cgroup.controllers", "memory");
        w("v2/memory.max", "max");
        w("v2/slurm/job_7/memory.max", "4294967296");
        w("v2/slurm/job_7/memory.current", "1073741824");
        w("v2/slurm/job_7/step_0/memory.max", "max");
        w("v2/slurm/job_7/step_0/task_0/memory.max", "max");
        let v2 = dir.path().join("v2");
        let v1 = dir.path().join("v1");
        assert_eq!(
            cgroup_memory_in("0::/slurm/job_7/step_0/task_0\n", &v2, &v1),
            Some((4 << 30, 1 << 30))
        );
        // v1: the process's own group, not the hierarchy's root (unlimited).
        w("v1/memory.limit_in_bytes", "9223372036854771712");
        w("v1/slurm/uid_0/job_9/memory.limit_in_bytes", "2147483648");
        w("v1/slurm/uid_0/job_9/memory.usage_in_bytes", "0");
        w(
            "v1/slurm/uid_0/job_9/step_0/memory.limit_in_bytes",
            "9223372036854771712",
        );
        let own = "12:pids:/slurm/uid_0/job_9/step_0\n4:memory:/slurm/uid_0/job_9/step_0\n1:name=systemd:/x\n";
        assert_eq!(
            cgroup_memory_in(own, &dir.path().join("none"), &v1),
            Some((2 << 30, 0))
        );
        // Unlimited everywhere: none.
        assert_eq!(
            cgroup_memory_in(
                "4:memory:/\n",
                &dir.path().join("none"),
                &v1.join("slurm/uid_0/job_9/step_0")
            ),
            None
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
