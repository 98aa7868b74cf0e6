//! `constraints`: probabilistic pairwise constraints from expert judgments with corruption.
//!
//! Uniform pairs from the training split (distinct, unordered, a ≠ b), y_clean = ⟨p_a, p_b⟩
//! under the pair's expert, corruption c ~ Bernoulli(π) replacing y by Uniform(0, 1). The
//! budget is split evenly across experts. A sample-disjoint diagnostic set of pairs from the
//! test split (never used for training) carries the hard oracle 1[t_a = t_b] as well.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use upcc_nn::Stream;

use crate::error::{DataPlace, Result, StageError};
use crate::expert::ExpertProbs;
use crate::features::Features;
use crate::table::{Table, TableBuilder};

pub const VERSION: u32 = 1;

/// What a spec may set for constraint generation (defaults: the paper's main setting).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConstraintSettings {
    /// Total number of training constraints (split evenly across experts).
    pub budget: usize,
    /// Corruption probability π.
    pub corruption: f64,
    /// Size of the held-out diagnostic set drawn from the test split.
    pub diagnostic_pairs: usize,
}

impl Default for ConstraintSettings {
    fn default() -> Self {
        ConstraintSettings {
            budget: 9000,
            corruption: 0.3,
            diagnostic_pairs: 1000,
        }
    }
}

impl crate::check::Check for ConstraintSettings {
    fn check(&self) -> Vec<crate::check::Problem> {
        let mut c = crate::check::Checker::new();
        c.at_least("budget", self.budget, 1);
        c.in_range("corruption", self.corruption, 0.0, 1.0, true);
        c.done()
    }
}

/// Parameters of one constraints node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConstraintParams {
    pub settings: ConstraintSettings,
    pub seed: u64,
}

/// A set of constraints (training or diagnostic).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Constraints {
    pub a: Vec<u32>,
    pub b: Vec<u32>,
    pub expert: Vec<u16>,
    pub y: Vec<f32>,
    /// The expert's judgment before corruption (unknown for user-supplied constraints).
    pub y_clean: Vec<Option<f32>>,
    pub corrupted: Vec<Option<bool>>,
    /// Diagnostic sets only: hard oracle 1[t_a = t_b] and its corrupted observation.
    pub oracle: Vec<f32>,
    pub y_oracle: Vec<f32>,
}

impl Constraints {
    pub fn len(&self) -> usize {
        self.y.len()
    }

    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    pub fn n_experts(&self) -> usize {
        self.expert
            .iter()
            .copied()
            .max()
            .map(|m| m as usize + 1)
            .unwrap_or(0)
    }

    pub fn to_parquet(&self) -> Result<Vec<u8>> {
        let mut t = TableBuilder::new()
            .u32("a", self.a.clone())
            .u32("b", self.b.clone())
            .u16("expert", self.expert.clone())
            .f32("y", self.y.clone())
            .f32_opt("y_clean", self.y_clean.clone())
            .bool_opt("corrupted", self.corrupted.clone());
        if !self.oracle.is_empty() {
            t = t
                .f32("oracle", self.oracle.clone())
                .f32("y_oracle", self.y_oracle.clone());
        }
        t.to_parquet()
    }

    pub fn from_parquet(bytes: &[u8], what: &str) -> Result<Constraints> {
        let t = Table::from_parquet(bytes, what)?;
        let has_oracle = t.has_column("oracle");
        Ok(Constraints {
            a: t.u32("a")?,
            b: t.u32("b")?,
            expert: t.u16("expert")?,
            y: t.f32("y")?,
            y_clean: t.f32_opt("y_clean")?,
            corrupted: t.bool_opt("corrupted")?,
            oracle: if has_oracle { t.f32("oracle")? } else { vec![] },
            y_oracle: if has_oracle {
                t.f32("y_oracle")?
            } else {
                vec![]
            },
        })
    }

    /// Record the judgment `clean` of expert `e` on (a, b) through the corruption channel:
    /// with probability π it is replaced by a Uniform(0, 1) draw, which is returned.
    fn observe(
        &mut self,
        a: u32,
        b: u32,
        e: usize,
        clean: f32,
        corruption: f64,
        noise: &mut Stream,
    ) -> Option<f32> {
        let corrupted = noise.bernoulli(corruption);
        let u = noise.uniform() as f32;
        self.a.push(a);
        self.b.push(b);
        self.expert.push(e as u16);
        self.y.push(if corrupted { u } else { clean });
        self.y_clean.push(Some(clean));
        self.corrupted.push(Some(corrupted));
        corrupted.then_some(u)
    }

    /// Check indices and values against the dataset: pairs within `rows`, on the training
    /// split (unless `test_split`), y finite in [0, 1]. `file` names the source; constraint i
    /// is its record i + 1.
    pub fn validate(&self, features: &Features, test_split: bool, file: &str) -> Result<()> {
        for i in 0..self.len() {
            let at = DataPlace::Row(i + 1);
            let y = self.y[i];
            if !y.is_finite() || !(0.0..=1.0).contains(&y) {
                return Err(StageError::data(
                    file,
                    at,
                    format!("the constraint's value y = {y} is outside [0, 1]; constraint values are probabilities"),
                ));
            }
            for (name, idx) in [("a", self.a[i]), ("b", self.b[i])] {
                let idx = idx as usize;
                if idx >= features.rows() {
                    return Err(StageError::data(
                        file,
                        at,
                        format!(
                            "`{name}` = {idx}, but the dataset has {} rows (0-based ids)",
                            features.rows()
                        ),
                    ));
                }
                if features.is_val.get(idx).copied().unwrap_or(false) {
                    return Err(StageError::data(
                        file,
                        at,
                        format!("the constraint uses instance {idx}, a validation row (reserved by the dataset's `validation`); constraints must use training rows"),
                    ));
                }
                if features.is_test[idx] != test_split {
                    return Err(StageError::data(
                        file,
                        at,
                        format!(
                        "the constraint uses instance {idx} from the {} split; training constraints must use training instances. \
                         Instances are the dataset's 0-based rows (with separate train and test files, the train file's rows first); the dataset's split decides which are training rows: \
                         `upcc run SPEC stage=features` then `upcc explain SPEC features/DATASET` gives the features table, whose `id` column \
                         lists the rows and `split` column says `train` or `test` (README: Your own constraints)",
                        if features.is_test[idx] { "test" } else { "training" }
                    ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Draw `count` distinct unordered pairs from `pool`.
fn sample_pairs(
    pool: &[usize],
    count: usize,
    rng: &mut Stream,
    what: &str,
) -> Result<Vec<(u32, u32)>> {
    let n = pool.len();
    let possible = n.saturating_mul(n.saturating_sub(1)) / 2;
    if count > possible {
        return Err(StageError::input(format!(
            "{what}: {count} distinct pairs were asked for but {n} instances only give {possible}; lower the budget"
        )));
    }
    let mut seen = HashSet::with_capacity(count * 2);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let i = rng.below(n as u64) as usize;
        let j = rng.below(n as u64) as usize;
        if i == j {
            continue;
        }
        let (a, b) = (pool[i] as u32, pool[j] as u32);
        let k = (a.min(b), a.max(b));
        if seen.insert(k) {
            out.push((a, b));
        }
    }
    Ok(out)
}

fn judgment(probs: &ExpertProbs, e: usize, a: u32, b: u32) -> f32 {
    let pa = probs.row(e, a as usize);
    let pb = probs.row(e, b as usize);
    let s: f64 = pa.iter().zip(pb).map(|(x, y)| *x as f64 * *y as f64).sum();
    s.clamp(0.0, 1.0) as f32
}

/// Where the judgments come from.
#[derive(Clone, Copy)]
pub enum Judge<'a> {
    /// The simulated experts: y = ⟨p_a, p_b⟩ under the pair's expert.
    Experts(&'a ExpertProbs),
    /// The oracle y = 1[t_a = t_b] from the true labels, under `experts` nominal expert ids
    /// (the budget split and the streams as for that many experts, so the pairs and the
    /// corruption draws are the expert setting's own).
    Oracle { experts: usize },
}

impl Judge<'_> {
    fn n_experts(&self) -> usize {
        match self {
            Judge::Experts(p) => p.n_experts,
            Judge::Oracle { experts } => *experts,
        }
    }

    fn judge(&self, features: &Features, e: usize, a: u32, b: u32) -> f32 {
        match self {
            Judge::Experts(p) => judgment(p, e, a, b),
            Judge::Oracle { .. } => oracle(features, a, b),
        }
    }
}

fn oracle(features: &Features, a: u32, b: u32) -> f32 {
    if features.labels[a as usize] == features.labels[b as usize] {
        1.0
    } else {
        0.0
    }
}

/// Generate the training constraints and the diagnostic set.
pub fn generate(
    node: &ConstraintParams,
    features: &Features,
    judge: Judge,
) -> Result<(Constraints, Constraints)> {
    let params = &node.settings;
    let seed = node.seed;
    if !(0.0..=1.0).contains(&params.corruption) || !params.corruption.is_finite() {
        return Err(StageError::input(format!(
            "`constraints.corruption` must be in [0, 1], got {}",
            params.corruption
        )));
    }
    if params.budget == 0 {
        return Err(StageError::input("`constraints.budget` must be at least 1"));
    }
    let n_experts = judge.n_experts();
    if n_experts == 0 {
        return Err(StageError::input("the supervision has no experts"));
    }
    let train = features.train_indices();
    let mut out = Constraints::default();
    for e in 0..n_experts {
        let share = params.budget / n_experts + usize::from(e < params.budget % n_experts);
        let label = e.to_string();
        let mut pair_rng = Stream::new(seed, &["constraints", "pairs", &label]);
        let mut noise_rng = Stream::new(seed, &["constraints", "corruption", &label]);
        for (a, b) in sample_pairs(&train, share, &mut pair_rng, "constraint budget")? {
            out.observe(
                a,
                b,
                e,
                judge.judge(features, e, a, b),
                params.corruption,
                &mut noise_rng,
            );
        }
    }
    let test = features.test_indices();
    let possible = test.len() * test.len().saturating_sub(1) / 2;
    let n_diag = params.diagnostic_pairs.min(possible);
    let mut diag = Constraints::default();
    let mut rng = Stream::new(seed, &["constraints", "diagnostic"]);
    let mut noise = Stream::new(seed, &["constraints", "diagnostic-corruption"]);
    for (i, (a, b)) in sample_pairs(&test, n_diag, &mut rng, "diagnostic set")?
        .into_iter()
        .enumerate()
    {
        let e = i % n_experts;
        let u = diag.observe(
            a,
            b,
            e,
            judge.judge(features, e, a, b),
            params.corruption,
            &mut noise,
        );
        let oracle = oracle(features, a, b);
        // The oracle variant goes through the same corruption draw.
        diag.oracle.push(oracle);
        diag.y_oracle.push(u.unwrap_or(oracle));
    }
    Ok((out, diag))
}

/// Read user-supplied constraints from CSV (header `a,b,y[,expert]`) or Parquet.
pub fn from_user_file(display: &str, bytes: &[u8], features: &Features) -> Result<Constraints> {
    let is_parquet = bytes.len() >= 4 && &bytes[..4] == b"PAR1";
    let mut c = Constraints::default();
    if is_parquet {
        let t = Table::from_parquet(bytes, &format!("`{display}`"))?;
        let num = |name: &str| -> Result<Vec<f64>> {
            let v = t.f64(name).or_else(|_| {
                t.f32(name)
                    .map(|v| v.into_iter().map(|x| x as f64).collect())
            });
            v.or_else(|_| {
                t.u32(name)
                    .map(|v| v.into_iter().map(|x| x as f64).collect())
            })
            .map_err(|_| {
                StageError::input(format!(
                    "`{display}` needs a numeric column `{name}` (columns: {})",
                    t.column_names().join(", ")
                ))
            })
        };
        let (a, b, y) = (num("a")?, num("b")?, num("y")?);
        let e = if t.has_column("expert") {
            num("expert")?
        } else {
            vec![0.0; y.len()]
        };
        for i in 0..y.len() {
            let at = DataPlace::Row(i + 1);
            c.a.push(to_index(display, "a", at, a[i])?);
            c.b.push(to_index(display, "b", at, b[i])?);
            c.expert.push(expert_id(display, at, e[i])?);
            c.y.push(y[i] as f32);
        }
    } else {
        let text = std::str::from_utf8(bytes).map_err(|_| {
            StageError::input(format!("`{display}` is neither Parquet nor UTF-8 CSV"))
        })?;
        let mut lines = crate::features::csv_file::text_lines(text);
        let (_, header) = lines
            .next()
            .ok_or_else(|| StageError::input(format!("`{display}` is empty")))?;
        let cols: Vec<&str> = header.split(',').map(|s| s.trim()).collect();
        let find = |name: &str| cols.iter().position(|c| *c == name);
        let (ia, ib, iy) = match (find("a"), find("b"), find("y")) {
            (Some(a), Some(b), Some(y)) => (a, b, y),
            _ => return Err(StageError::input(format!("`{display}`: the header must name columns `a`, `b` and `y` (and optionally `expert`); found `{header}`"))),
        };
        let ie = find("expert");
        for (no, line) in lines {
            let f: Vec<&str> = line.split(',').map(|s| s.trim()).collect();
            if f.len() != cols.len() {
                return Err(StageError::data(
                    display,
                    DataPlace::Line(no + 1),
                    format!("{} fields, expected {}", f.len(), cols.len()),
                ));
            }
            let num = |j: usize| -> Result<f64> {
                f[j].parse::<f64>().map_err(|_| {
                    StageError::data(
                        display,
                        DataPlace::Line(no + 1),
                        format!("`{}` is not a number", f[j]),
                    )
                })
            };
            let at = DataPlace::Line(no + 1);
            c.a.push(to_index(display, "a", at, num(ia)?)?);
            c.b.push(to_index(display, "b", at, num(ib)?)?);
            c.expert.push(match ie {
                Some(j) => expert_id(display, at, num(j)?)?,
                None => 0,
            });
            c.y.push(num(iy)? as f32);
        }
    }
    c.y_clean = vec![None; c.y.len()];
    c.corrupted = vec![None; c.y.len()];
    if c.is_empty() {
        return Err(StageError::input(format!(
            "`{display}` holds no constraints"
        )));
    }
    if let Some(i) = (0..c.len()).find(|&i| c.a[i] == c.b[i]) {
        return Err(StageError::input(format!(
            "`{display}`: constraint {} pairs instance {} with itself; a constraint relates two different instances",
            i + 1,
            c.a[i]
        )));
    }
    // Expert ids number the experts 0..E−1, each used (one Corrector per id).
    let ids: std::collections::BTreeSet<u16> = c.expert.iter().copied().collect();
    let e = ids.len();
    if ids.iter().next_back().is_some_and(|&m| m as usize + 1 != e) {
        let shown: Vec<String> = ids.iter().take(12).map(|i| i.to_string()).collect();
        return Err(StageError::input(format!(
            "`{display}`: the `expert` column must number the experts 0, 1, …, E−1 with every id used; it has {e} distinct ids ({}{}): renumber them 0..{}",
            shown.join(", "),
            if e > 12 { ", …" } else { "" },
            e - 1
        )));
    }
    c.validate(features, false, display)?;
    Ok(c)
}

fn expert_id(display: &str, at: DataPlace, v: f64) -> Result<u16> {
    let i = to_index(display, "expert", at, v)?;
    u16::try_from(i).map_err(|_| {
        StageError::data(
            display,
            at,
            format!("expert id {i} is too large (experts are numbered 0..E−1)"),
        )
    })
}

fn to_index(display: &str, name: &str, at: DataPlace, v: f64) -> Result<u32> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64 {
        Ok(v as u32)
    } else {
        Err(StageError::data(
            display,
            at,
            format!("`{name}` = {v} is not a non-negative integer index"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40 rows, 4 classes, the last 10 rows the test split.
    fn features() -> Features {
        let n = 40;
        Features {
            ids: (0..n as u32).collect(),
            labels: (0..n as u32).map(|i| i % 4).collect(),
            is_test: (0..n).map(|i| i >= 30).collect(),
            is_val: vec![false; n],
            x: vec![0.0; n],
            dim: 1,
            n_classes: 4,
        }
    }

    /// Experts that are sure of a wrong class (so their judgments differ from the oracle's).
    fn probs(f: &Features, experts: usize) -> ExpertProbs {
        let mut p = Vec::new();
        for e in 0..experts {
            for r in 0..f.rows() {
                let c = (f.labels[r] as usize + 1 + e) % 4;
                p.extend((0..4).map(|k| if k == c { 0.9 } else { 0.1 / 3.0 }));
            }
        }
        ExpertProbs {
            n_experts: experts,
            n_classes: 4,
            rows: f.rows(),
            p,
        }
    }

    #[test]
    fn oracle_judgments_take_the_expert_settings_pairs_and_corruption_draws() {
        let f = features();
        let node = ConstraintParams {
            settings: ConstraintSettings {
                budget: 90,
                corruption: 0.3,
                diagnostic_pairs: 20,
            },
            seed: 7,
        };
        let probs = probs(&f, 3);
        let (ex, ex_diag) = generate(&node, &f, Judge::Experts(&probs)).unwrap();
        let (or, or_diag) = generate(&node, &f, Judge::Oracle { experts: 3 }).unwrap();
        // Same pairs, nominal experts and corruption pattern as the 3-expert setting.
        assert_eq!((&ex.a, &ex.b, &ex.expert), (&or.a, &or.b, &or.expert));
        assert_eq!(ex.corrupted, or.corrupted);
        assert_eq!(or.n_experts(), 3);
        for i in 0..or.len() {
            let truth = oracle(&f, or.a[i], or.b[i]);
            assert_eq!(or.y_clean[i], Some(truth));
            if or.corrupted[i] == Some(true) {
                // The corrupting Uniform(0, 1) draw is the same one.
                assert_eq!(or.y[i], ex.y[i]);
            } else {
                assert_eq!(or.y[i], truth);
            }
            assert!(!f.is_test[or.a[i] as usize] && !f.is_test[or.b[i] as usize]);
        }
        assert!((0..ex.len()).any(|i| ex.y_clean[i] != or.y_clean[i]));
        // The diagnostic set: the same test pairs; its judgments are the oracle's.
        assert_eq!((&ex_diag.a, &ex_diag.b), (&or_diag.a, &or_diag.b));
        assert_eq!(or_diag.oracle, ex_diag.oracle);
        assert_eq!(or_diag.y_oracle, ex_diag.y_oracle);
        assert_eq!(or_diag.y, or_diag.y_oracle);
        assert!(or_diag.a.iter().all(|&a| f.is_test[a as usize]));
    }

    #[test]
    fn a_setting_without_experts_is_refused() {
        let node = ConstraintParams {
            settings: ConstraintSettings::default(),
            seed: 1,
        };
        assert!(generate(&node, &features(), Judge::Oracle { experts: 0 }).is_err());
    }
}
