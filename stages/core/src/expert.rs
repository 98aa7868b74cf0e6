//! `expert`: simulated expert classifiers (Appendix C.3/C.5).
//!
//! Single-expert level `lv r`: a class-stratified subset of ⌊r·n_c⌋ (at least one) training
//! samples per class. Multi-expert settings (`multi E`): complementary blind spots, familiar
//! classes at fraction h, unfamiliar at l. Each expert is an MLP 512-512 (ReLU, dropout 0.2,
//! softmax) trained with Adam 1e-3, batch 256, ≤100 epochs, patience 10 on training accuracy.
//! Outputs every instance's class probabilities per expert, and each expert's accuracy.

use serde::{Deserialize, Serialize};
use upcc_nn::{Act, Adam, Device, Ix, Mlp, Stream, WeightInit};

use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{predict_proba, G, P};
use crate::table::{Table, TableBuilder};

pub const VERSION: u32 = 1;

/// How experts see the classes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ExpertSetting {
    /// One expert trained on fraction `level` of each class.
    Single { level: f64 },
    /// `experts` complementary experts: familiar classes at fraction `familiar`, unfamiliar
    /// (blind-spot) classes at `unfamiliar`, at least one sample per class.
    Multi {
        experts: usize,
        familiar: f64,
        unfamiliar: f64,
    },
}

/// Classifier hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassifierParams {
    pub hidden: Vec<usize>,
    pub dropout: f64,
    pub lr: f64,
    pub batch_size: usize,
    pub max_epochs: usize,
    /// Stop when training accuracy has not improved for this many epochs.
    pub patience: usize,
}

impl Default for ClassifierParams {
    fn default() -> Self {
        ClassifierParams {
            hidden: vec![512, 512],
            dropout: 0.2,
            lr: 1e-3,
            batch_size: 256,
            max_epochs: 100,
            patience: 10,
        }
    }
}

/// Bytes an expert node needs: one classifier at a time with its optimiser state and a
/// mini-batch's activations, the data, and every expert's class probabilities.
pub fn memory_bytes(
    cp: &ClassifierParams,
    dim: usize,
    classes: usize,
    rows: usize,
    experts: usize,
) -> u128 {
    let mut dims = vec![dim];
    dims.extend_from_slice(&cp.hidden);
    dims.push(classes);
    crate::check::net_bytes(&dims, cp.batch_size)
        .saturating_add(crate::check::f32_bytes(rows, dim))
        .saturating_add(crate::check::f32_bytes(rows, classes).saturating_mul(experts as u128))
}

impl crate::check::Check for ClassifierParams {
    fn check(&self) -> Vec<crate::check::Problem> {
        let mut c = crate::check::Checker::new();
        c.sizes("hidden", &self.hidden, true);
        c.in_range("dropout", self.dropout, 0.0, 1.0, false);
        c.learning_rate("lr", self.lr);
        c.at_least("batch_size", self.batch_size, 1);
        c.epochs("max_epochs", self.max_epochs, 1);
        c.at_least("patience", self.patience, 1);
        if let Some(p) = crate::check::fits_in_memory(
            "hidden",
            "an expert of these sizes",
            crate::check::net_bytes(
                &[&[1usize][..], &self.hidden, &[1]].concat(),
                self.batch_size,
            ),
        ) {
            c.problems.push(p);
        }
        c.done()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertParams {
    pub setting: ExpertSetting,
    pub classifier: ClassifierParams,
    pub seed: u64,
}

/// One trained expert's facts.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertSummary {
    pub expert: u16,
    pub train_size: u32,
    pub epochs: u32,
    pub train_accuracy: f64,
    pub test_accuracy: f64,
    pub unfamiliar: Vec<u32>,
}

/// Class probabilities of every instance under every expert.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertProbs {
    pub n_experts: usize,
    pub n_classes: usize,
    pub rows: usize,
    /// [expert][row][class], flattened.
    pub p: Vec<f32>,
}

impl ExpertProbs {
    pub fn row(&self, expert: usize, row: usize) -> &[f32] {
        let base = (expert * self.rows + row) * self.n_classes;
        &self.p[base..base + self.n_classes]
    }

    pub fn to_parquet(&self) -> Result<Vec<u8>> {
        let mut expert = Vec::with_capacity(self.n_experts * self.rows);
        let mut id = Vec::with_capacity(self.n_experts * self.rows);
        for e in 0..self.n_experts {
            for r in 0..self.rows {
                expert.push(e as u16);
                id.push(r as u32);
            }
        }
        TableBuilder::new()
            .u16("expert", expert)
            .u32("id", id)
            .f32_rows("p", self.n_classes, self.p.clone())
            .meta("n_experts", self.n_experts)
            .to_parquet()
    }

    pub fn from_parquet(bytes: &[u8]) -> Result<ExpertProbs> {
        let t = Table::from_parquet(bytes, "expert probabilities")?;
        let (p, n_classes) = t.f32_rows("p")?;
        let experts = t.u16("expert")?;
        let n_experts = experts
            .iter()
            .copied()
            .max()
            .map(|m| m as usize + 1)
            .unwrap_or(0);
        let rows = experts.len().checked_div(n_experts).unwrap_or(0);
        Ok(ExpertProbs {
            n_experts,
            n_classes,
            rows,
            p,
        })
    }
}

pub fn summaries_to_parquet(s: &[ExpertSummary]) -> Result<Vec<u8>> {
    TableBuilder::new()
        .u16("expert", s.iter().map(|x| x.expert).collect())
        .u32("train_size", s.iter().map(|x| x.train_size).collect())
        .u32("epochs", s.iter().map(|x| x.epochs).collect())
        .f64(
            "train_accuracy",
            s.iter().map(|x| x.train_accuracy).collect(),
        )
        .f64("test_accuracy", s.iter().map(|x| x.test_accuracy).collect())
        .str(
            "unfamiliar",
            s.iter()
                .map(|x| {
                    x.unfamiliar
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .collect(),
        )
        .to_parquet()
}

/// Unfamiliar classes of each of `experts` experts over `n_classes` classes (Appendix C.3):
/// consecutive balanced blocks when E ≤ C; otherwise full groups of C experts each blind to
/// one class, and a partial group whose blind classes are sampled without replacement.
pub fn blind_spots(n_classes: usize, experts: usize, rng: &mut Stream) -> Vec<Vec<u32>> {
    if experts <= n_classes {
        let q = n_classes / experts;
        let r = n_classes % experts;
        let mut out = Vec::new();
        let mut start = 0;
        for e in 0..experts {
            let size = q + usize::from(e < r);
            out.push((start as u32..(start + size) as u32).collect());
            start += size;
        }
        out
    } else {
        let full = experts / n_classes;
        let mut out: Vec<Vec<u32>> = Vec::new();
        for _ in 0..full {
            for c in 0..n_classes {
                out.push(vec![c as u32]);
            }
        }
        let rest = experts - full * n_classes;
        for c in rng.sample_without_replacement(n_classes, rest) {
            out.push(vec![c]);
        }
        out
    }
}

/// Class-stratified subset: ⌊fraction_c · n_c⌋ samples of each class c, at least one.
pub fn stratified_subset(
    features: &Features,
    fraction: &dyn Fn(u32) -> f64,
    rng: &mut Stream,
) -> Vec<usize> {
    let train = features.train_indices();
    let mut out = Vec::new();
    for c in 0..features.n_classes as u32 {
        let idx: Vec<usize> = train
            .iter()
            .copied()
            .filter(|&i| features.labels[i] == c)
            .collect();
        let k = ((fraction(c) * idx.len() as f64).floor() as usize)
            .max(1)
            .min(idx.len());
        for j in rng.sample_without_replacement(idx.len(), k) {
            out.push(idx[j as usize]);
        }
    }
    out.sort_unstable();
    out
}

/// Train the experts of `params.setting` and return their probabilities and summaries.
pub fn run<D: Device<f32>>(
    dev: &D,
    params: &ExpertParams,
    features: &Features,
    monitor: &mut dyn Monitor,
) -> Result<(ExpertProbs, Vec<ExpertSummary>)> {
    let c = features.n_classes;
    let mut setup_rng = Stream::new(params.seed, &["expert", "setup"]);
    let fractions: Vec<Vec<f64>> = match &params.setting {
        ExpertSetting::Single { level } => {
            check_fraction("setting.level", *level)?;
            vec![vec![*level; c]]
        }
        ExpertSetting::Multi {
            experts,
            familiar,
            unfamiliar,
        } => {
            check_fraction("setting.familiar", *familiar)?;
            check_fraction("setting.unfamiliar", *unfamiliar)?;
            if *experts < 1 {
                return Err(StageError::input("`setting.experts` must be at least 1"));
            }
            blind_spots(c, *experts, &mut setup_rng)
                .into_iter()
                .map(|blind| {
                    (0..c as u32)
                        .map(|k| {
                            if blind.contains(&k) {
                                *unfamiliar
                            } else {
                                *familiar
                            }
                        })
                        .collect()
                })
                .collect()
        }
    };
    let n_experts = fractions.len();
    let x = dev.upload(&features.x)?;
    let mut probs = Vec::with_capacity(n_experts * features.rows() * c);
    let mut summaries = Vec::new();
    for (e, frac) in fractions.iter().enumerate() {
        let label = format!("{e}");
        let mut rng = Stream::new(params.seed, &["expert", "subset", &label]);
        let subset = stratified_subset(features, &|k| frac[k as usize], &mut rng);
        let unfamiliar: Vec<u32> = (0..c as u32)
            .filter(|&k| frac[k as usize] < frac.iter().cloned().fold(0.0, f64::max))
            .collect();
        monitor.log(&format!(
            "expert {e}: {} training samples, unfamiliar classes {unfamiliar:?}",
            subset.len()
        ));
        let job = Job {
            expert: e,
            of: n_experts,
            subset: &subset,
        };
        let (p, summary) = train_one(dev, params, features, &x, job, monitor)?;
        probs.extend(p);
        summaries.push(ExpertSummary {
            unfamiliar,
            ..summary
        });
    }
    Ok((
        ExpertProbs {
            n_experts,
            n_classes: c,
            rows: features.rows(),
            p: probs,
        },
        summaries,
    ))
}

fn check_fraction(field: &str, v: f64) -> Result<()> {
    if !(v > 0.0 && v <= 1.0) {
        return Err(StageError::input(format!(
            "`{field}` must be in (0, 1], got {v}"
        )));
    }
    Ok(())
}

/// One expert to train: its number among `of`, and the training rows it knows.
struct Job<'a> {
    expert: usize,
    of: usize,
    subset: &'a [usize],
}

fn train_one<D: Device<f32>>(
    dev: &D,
    params: &ExpertParams,
    features: &Features,
    x: &D::Buf,
    job: Job<'_>,
    monitor: &mut dyn Monitor,
) -> Result<(Vec<f32>, ExpertSummary)> {
    let (e, n_experts, subset) = (job.expert, job.of, job.subset);
    let cp = &params.classifier;
    crate::check::require("expert", crate::check::Check::check(cp))?;
    let bytes = memory_bytes(
        cp,
        features.dim,
        features.n_classes,
        features.rows(),
        n_experts,
    );
    if let Some(problem) = crate::check::fits_in_memory("hidden", "this expert", bytes) {
        crate::check::require("expert", vec![problem])?;
    }
    let label = format!("{e}");
    let mut rng = Stream::new(params.seed, &["expert", "init", &label]);
    let mut p = P::new(dev);
    let mut dims = vec![features.dim];
    dims.extend_from_slice(&cp.hidden);
    dims.push(features.n_classes);
    let mlp = Mlp::new(
        &mut p,
        "classifier",
        &dims,
        Act::Relu,
        Act::Identity,
        WeightInit::Torch,
        0,
        &mut rng,
    )?;
    let mut opt = Adam::new(&p, vec![cp.lr])?;
    let mut g = G::new(dev)?;
    let mut acc = dev.scalars(1)?;
    let mut shuffle = Stream::new(params.seed, &["expert", "batches", &label]);
    let mut drop_rng = Stream::new(params.seed, &["expert", "dropout", &label]);
    let (mut best, mut wait, mut epochs, mut last_acc) = (-1.0f64, 0usize, 0usize, 0.0);
    for epoch in 0..cp.max_epochs {
        let mut order: Vec<usize> = subset.to_vec();
        shuffle.shuffle(&mut order);
        // The epoch's row order and labels, uploaded once.
        let rows: Vec<u32> = order.iter().map(|&i| i as u32).collect();
        let labels: Vec<u32> = order.iter().map(|&i| features.labels[i]).collect();
        let rows = dev.upload_idx(&rows)?;
        let labels = dev.upload_idx(&labels)?;
        dev.scalars_fill(&mut acc, 0.0)?;
        for (bi, batch) in order.chunks(cp.batch_size).enumerate() {
            let (off, n) = (bi * cp.batch_size, batch.len());
            g.reset();
            p.zero_grads();
            let xi = g.input_rows(x, features.dim, Ix::new(&rows, off, n))?;
            let logits = mlp.forward(&mut g, &p, xi, Some((cp.dropout, &mut drop_rng)))?;
            let loss = g.softmax_ce(logits, Ix::new(&labels, off, n))?;
            g.accumulate(loss, 1, 1.0, &mut acc, 0)?;
            g.backward(loss, &mut p)?;
            opt.step(&mut p)?;
        }
        let correct = dev.scalars_to_vec(&acc)?[0] as usize;
        epochs = epoch + 1;
        // Keras-style: the epoch's running training accuracy (dropout on) is monitored.
        last_acc = correct as f64 / subset.len() as f64;
        monitor.progress(
            (e * cp.max_epochs + epoch + 1) as u64,
            (n_experts * cp.max_epochs) as u64,
            &format!("expert {e} train acc {last_acc:.3}"),
        );
        if last_acc > best {
            best = last_acc;
            wait = 0;
        } else {
            wait += 1;
            if wait >= cp.patience {
                break;
            }
        }
    }
    if !p.all_finite()? {
        return Err(StageError::failed(format!(
            "expert {e}: training diverged (non-finite weights)"
        )));
    }
    let probs = predict_proba(&mlp, &p, x, features.dim, features.rows())?;
    let test = features.test_indices();
    let hits = test
        .iter()
        .filter(|&&i| {
            let row = &probs[i * features.n_classes..(i + 1) * features.n_classes];
            argmax(row) == features.labels[i] as usize
        })
        .count();
    let test_accuracy = hits as f64 / test.len().max(1) as f64;
    monitor.log(&format!(
        "expert {e}: {epochs} epochs, train acc {last_acc:.4}, test acc {test_accuracy:.4}"
    ));
    Ok((
        probs,
        ExpertSummary {
            expert: e as u16,
            train_size: subset.len() as u32,
            epochs: epochs as u32,
            train_accuracy: last_acc,
            test_accuracy,
            unfamiliar: vec![],
        },
    ))
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(c: usize, e: usize) -> Vec<usize> {
        let mut rng = Stream::new(0, &["t"]);
        blind_spots(c, e, &mut rng)
            .iter()
            .map(|b| b.len())
            .collect()
    }

    #[test]
    fn blind_spot_counts_match_table_2_of_the_paper() {
        assert_eq!(counts(10, 2), [5, 5]);
        assert_eq!(counts(10, 3), [4, 3, 3]);
        assert_eq!(counts(10, 10), [1; 10]);
        assert_eq!(counts(20, 2), [10, 10]);
        assert_eq!(counts(20, 3), [7, 7, 6]);
        assert_eq!(counts(20, 10), [2; 10]);
        assert_eq!(counts(4, 2), [2, 2]);
        assert_eq!(counts(4, 3), [2, 1, 1]);
        assert_eq!(counts(4, 10), [1; 10]);
    }

    #[test]
    fn blocks_are_consecutive_and_complementary() {
        let mut rng = Stream::new(0, &["t"]);
        let b = blind_spots(10, 3, &mut rng);
        assert_eq!(b, vec![vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);
        // E > C: full groups each blind to one distinct class, then a sampled partial group.
        let b = blind_spots(4, 10, &mut rng);
        for g in 0..2 {
            let mut group: Vec<u32> = b[4 * g..4 * g + 4].iter().map(|x| x[0]).collect();
            group.sort();
            assert_eq!(group, [0, 1, 2, 3]);
        }
        let mut partial: Vec<u32> = b[8..].iter().map(|x| x[0]).collect();
        partial.sort();
        partial.dedup();
        assert_eq!(partial.len(), 2, "sampled without replacement");
    }

    #[test]
    fn stratified_subset_keeps_at_least_one_sample_per_class() {
        let n = 200;
        let f = Features {
            ids: (0..n as u32).collect(),
            labels: (0..n as u32).map(|i| i % 4).collect(),
            is_test: (0..n).map(|i| i >= 160).collect(),
            is_val: vec![false; n],
            x: vec![0.0; n],
            dim: 1,
            n_classes: 4,
        };
        let mut rng = Stream::new(1, &["t"]);
        // l = 0.0001 of 40 training samples per class rounds down to 0: one is kept.
        let s = stratified_subset(&f, &|c| if c == 0 { 0.1 } else { 0.0001 }, &mut rng);
        let per_class: Vec<usize> = (0..4)
            .map(|c| s.iter().filter(|&&i| f.labels[i] == c).count())
            .collect();
        assert_eq!(per_class, [4, 1, 1, 1]);
        assert!(
            s.iter().all(|&i| !f.is_test[i]),
            "experts train on the training split only"
        );
    }
}
