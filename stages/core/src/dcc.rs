//! `dcc`: the end-to-end deep constrained clustering baselines (Appendix C.2, C.5).
//!
//! **VanillaDCC** (MCL): an MLP d→512→512→C with softmax assignments q; the co-assignment
//! probability of a pair is P = q_aᵀq_b, trained by BCE against the real-valued y; Adam 1e-3,
//! batch 256, at most 500 epochs, stopping when the fraction of training points whose argmax
//! changed stays below 1e-3 for two consecutive checks; the partition is the argmax of q.
//!
//! **VolMaxDCC**: P = q_aᵀ B q_b with B = σ(B′) (B′ starts at +1 on the diagonal and −1 off
//! it), minus λ·log det(QᵀQ) over the assignments Q of a fresh random subset of at most 10k
//! training rows per mini-batch (the reference code); plain SGD with lr 0.5 for the network and
//! 0.1 for B′, batch 128. λ is chosen by validation ACC (the CLI wires the search).

use serde::{Deserialize, Serialize};
use upcc_nn::{Act, Adam, Device, Ix, Mlp, ParamId, Sgd, Stream, WeightInit};

use crate::check::{Check, Checker, Problem};
use crate::cluster::Assignments;
use crate::constraints::Constraints;
use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{map_rows, Rows, EVAL_ROWS, G, P};
use crate::table::TableBuilder;

pub const VERSION: u32 = 1;

/// Stop when the fraction of training points whose hard assignment changed since the last
/// check is below `tol` for `consecutive` checks in a row (DEC/IDEC practice).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AssignmentStop {
    pub tol: f64,
    /// The paper: 2; the reference code: 1.
    pub consecutive: usize,
    /// No stop before this many epochs (the reference code: 10 for VanillaDCC, 30 for CIDEC).
    pub min_epochs: usize,
}

impl Default for AssignmentStop {
    fn default() -> Self {
        AssignmentStop {
            tol: 1e-3,
            consecutive: 2,
            min_epochs: 0,
        }
    }
}

impl AssignmentStop {
    fn check_into(&self, c: &mut Checker, prefix: &str) {
        c.in_range(&format!("{prefix}tol"), self.tol, 0.0, 1.0, true);
        c.at_least(&format!("{prefix}consecutive"), self.consecutive, 1);
    }
}

/// Fraction of positions where two label vectors differ.
pub fn changed_fraction(prev: &[u32], now: &[u32]) -> f64 {
    if now.is_empty() {
        return 0.0;
    }
    prev.iter().zip(now).filter(|(a, b)| a != b).count() as f64 / now.len() as f64
}

/// Follows an [`AssignmentStop`] rule across epochs.
pub struct StopTracker {
    rule: AssignmentStop,
    prev: Option<Vec<u32>>,
    below: usize,
}

impl StopTracker {
    pub fn new(rule: &AssignmentStop) -> Self {
        StopTracker {
            rule: rule.clone(),
            prev: None,
            below: 0,
        }
    }

    /// The assignments after `epochs_done` epochs: the changed fraction (none at the first
    /// check) and whether to stop.
    pub fn observe(&mut self, epochs_done: usize, labels: Vec<u32>) -> (Option<f64>, bool) {
        let change = self.prev.as_ref().map(|p| changed_fraction(p, &labels));
        self.prev = Some(labels);
        match change {
            Some(c) if c < self.rule.tol => self.below += 1,
            _ => self.below = 0,
        }
        let stop = epochs_done >= self.rule.min_epochs && self.below >= self.rule.consecutive;
        (change, stop)
    }

    /// Epoch `epoch` (0-based, of `total`) is done with `loss` and training assignments
    /// `labels`: record it in `curve`, report progress, log a stop; whether to stop.
    pub fn epoch_done(
        &mut self,
        epoch: usize,
        total: usize,
        loss: f64,
        labels: Vec<u32>,
        curve: &mut Vec<DccEpoch>,
        monitor: &mut dyn Monitor,
    ) -> bool {
        let (change, stop_now) = self.observe(epoch + 1, labels);
        curve.push(DccEpoch {
            epoch: epoch as u32,
            loss,
            changed: change.unwrap_or(f64::NAN),
        });
        monitor.progress(
            epoch as u64 + 1,
            total as u64,
            &match change {
                Some(c) => format!("loss {loss:.4}, assignments changed {:.2}%", 100.0 * c),
                None => format!("loss {loss:.4}"),
            },
        );
        if stop_now {
            monitor.log(&format!(
                "stopped after {} epochs: assignments changed by less than {} for {} checks",
                epoch + 1,
                self.rule.tol,
                self.rule.consecutive
            ));
        }
        stop_now
    }
}

/// VanillaDCC's settings (section `dcc`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DccSettings {
    pub hidden: Vec<usize>,
    pub epochs: usize,
    pub lr: f64,
    pub batch_size: usize,
    /// Global gradient-norm clip (the reference code clips at 1; None: no clipping).
    pub grad_clip: Option<f64>,
    /// P is clamped to [eps, 1 − eps] inside the BCE.
    pub eps: f64,
    pub stop: AssignmentStop,
}

impl Default for DccSettings {
    fn default() -> Self {
        DccSettings {
            hidden: vec![512, 512],
            epochs: 500,
            lr: 1e-3,
            batch_size: 256,
            grad_clip: Some(1.0),
            eps: 1e-7,
            // The paper: two consecutive checks; silent on a minimum, where the code waits
            // for epoch 10 (FIDELITY.md).
            stop: AssignmentStop {
                min_epochs: 10,
                ..AssignmentStop::default()
            },
        }
    }
}

fn check_net(
    c: &mut Checker,
    hidden: &[usize],
    epochs: usize,
    batch: usize,
    clip: Option<f64>,
    eps: f64,
) {
    c.sizes("hidden", hidden, true);
    c.epochs("epochs", epochs, 1);
    c.at_least("batch_size", batch, 1);
    if let Some(g) = clip {
        if !(g.is_finite() && g > 0.0) {
            c.push(
                "grad_clip",
                format!("must be a finite number > 0 (or null for no clipping), got {g}"),
            );
        }
    }
    c.in_range("eps", eps, 0.0, 0.5, false);
}

impl Check for DccSettings {
    fn check(&self) -> Vec<Problem> {
        let mut c = Checker::new();
        check_net(
            &mut c,
            &self.hidden,
            self.epochs,
            self.batch_size,
            self.grad_clip,
            self.eps,
        );
        c.learning_rate("lr", self.lr);
        self.stop.check_into(&mut c, "stop.");
        c.done()
    }
}

/// VolMaxDCC's settings (section `volmax`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VolMaxSettings {
    pub hidden: Vec<usize>,
    pub epochs: usize,
    /// SGD learning rate of the network.
    pub lr: f64,
    /// SGD learning rate of B′.
    pub b_lr: f64,
    pub batch_size: usize,
    pub grad_clip: Option<f64>,
    pub eps: f64,
    /// The λ grid searched by validation ACC.
    pub lambdas: Vec<f64>,
    /// A fixed λ instead of the search.
    pub lambda: Option<f64>,
    /// Validation runs per λ (trial seeds 1..=search_runs).
    pub search_runs: usize,
    /// Rows of the fresh random subset whose assignments enter log det(QᵀQ) per mini-batch.
    pub volume_rows: usize,
    /// εI added to QᵀQ.
    pub volume_eps: f64,
    /// Initial B′ on the diagonal and off it.
    pub b_diag: f64,
    pub b_off: f64,
    /// Multi-expert settings share the λ selected under this supervision setting, when the
    /// spec defines it (the paper: one λ for the multi-expert settings); null: each selects its
    /// own.
    pub shared_multi: Option<String>,
    /// Where the λ search runs: once per dataset and setting at the main constraint budget and
    /// corruption (`setting`, the paper's Table 5), or in every cell (`cell`).
    pub search_scope: crate::ensemble::SearchScope,
    pub stop: AssignmentStop,
}

impl Default for VolMaxSettings {
    fn default() -> Self {
        VolMaxSettings {
            hidden: vec![512, 512],
            epochs: 500,
            lr: 0.5,
            b_lr: 0.1,
            batch_size: 128,
            grad_clip: Some(1.0),
            eps: 1e-6,
            lambdas: vec![0.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5],
            lambda: None,
            search_runs: 3,
            volume_rows: 10_000,
            volume_eps: 1e-6,
            b_diag: 1.0,
            b_off: -1.0,
            shared_multi: Some("multi3".into()),
            search_scope: crate::ensemble::SearchScope::Setting,
            stop: AssignmentStop {
                min_epochs: 10,
                ..AssignmentStop::default()
            },
        }
    }
}

impl Check for VolMaxSettings {
    fn check(&self) -> Vec<Problem> {
        let mut c = Checker::new();
        check_net(
            &mut c,
            &self.hidden,
            self.epochs,
            self.batch_size,
            self.grad_clip,
            self.eps,
        );
        c.learning_rate("lr", self.lr);
        c.learning_rate("b_lr", self.b_lr);
        if self.lambda.is_none() && self.lambdas.is_empty() {
            c.push(
                "lambdas",
                "needs at least one λ to search (or set `lambda`)",
            );
        }
        for (i, l) in self.lambdas.iter().enumerate() {
            c.non_negative(&format!("lambdas[{i}]"), *l);
        }
        if let Some(l) = self.lambda {
            c.non_negative("lambda", l);
        }
        c.at_least("search_runs", self.search_runs, 1);
        c.at_least("volume_rows", self.volume_rows, 1);
        c.non_negative("volume_eps", self.volume_eps);
        if !(self.b_diag.is_finite() && self.b_off.is_finite()) {
            c.push("b_diag", "B′'s initial values must be finite");
        }
        self.stop.check_into(&mut c, "stop.");
        c.done()
    }
}

/// What one DCC training node runs: the network, the optional VolMax terms, the seed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DccParams {
    pub hidden: Vec<usize>,
    pub epochs: usize,
    pub batch_size: usize,
    pub grad_clip: Option<f64>,
    pub eps: f64,
    pub stop: AssignmentStop,
    pub optimizer: DccOptimizer,
    pub seed: u64,
}

/// How a DCC network is optimised (and whether it is VolMaxDCC).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DccOptimizer {
    /// VanillaDCC: Adam on the network.
    Adam { lr: f64 },
    /// VolMaxDCC: plain SGD (net `lr`, B′ `b_lr`) with the confusion matrix and volume term.
    VolMax {
        lr: f64,
        b_lr: f64,
        /// None: given at run time (chosen by a selection node).
        lambda: Option<f64>,
        volume_rows: usize,
        volume_eps: f64,
        b_diag: f64,
        b_off: f64,
    },
}

/// Bytes a DCC node needs: the network with its optimiser state and the activations of a
/// mini-batch (two instances per pair, plus VolMaxDCC's volume rows), the data and every
/// instance's assignment probabilities.
pub fn memory_bytes(p: &DccParams, dim: usize, classes: usize, rows: usize) -> u128 {
    let mut dims = vec![dim];
    dims.extend_from_slice(&p.hidden);
    dims.push(classes);
    let volume = match &p.optimizer {
        DccOptimizer::VolMax { volume_rows, .. } => *volume_rows,
        DccOptimizer::Adam { .. } => 0,
    };
    crate::check::net_bytes(&dims, p.batch_size.saturating_mul(2).saturating_add(volume))
        .saturating_add(crate::check::f32_bytes(rows, dim))
        .saturating_add(crate::check::f32_bytes(rows, classes))
}

impl DccParams {
    pub fn vanilla(s: &DccSettings, seed: u64) -> Self {
        DccParams {
            hidden: s.hidden.clone(),
            epochs: s.epochs,
            batch_size: s.batch_size,
            grad_clip: s.grad_clip,
            eps: s.eps,
            stop: s.stop.clone(),
            optimizer: DccOptimizer::Adam { lr: s.lr },
            seed,
        }
    }

    pub fn volmax(s: &VolMaxSettings, lambda: Option<f64>, seed: u64) -> Self {
        DccParams {
            hidden: s.hidden.clone(),
            epochs: s.epochs,
            batch_size: s.batch_size,
            grad_clip: s.grad_clip,
            eps: s.eps,
            stop: s.stop.clone(),
            optimizer: DccOptimizer::VolMax {
                lr: s.lr,
                b_lr: s.b_lr,
                lambda,
                volume_rows: s.volume_rows,
                volume_eps: s.volume_eps,
                b_diag: s.b_diag,
                b_off: s.b_off,
            },
            seed,
        }
    }
}

/// One epoch's record.
#[derive(Clone, Debug)]
pub struct DccEpoch {
    pub epoch: u32,
    pub loss: f64,
    /// Fraction of training points whose argmax changed in this epoch (NaN at the first).
    pub changed: f64,
}

/// Output of a DCC run: the native (argmax) partition of every row and the curve.
pub struct DccTrained {
    pub assignments: Assignments,
    pub curve: Vec<DccEpoch>,
}

fn argmax_rows(v: &[f32], cols: usize) -> Vec<u32> {
    v.chunks(cols)
        .map(|r| crate::expert::argmax(r) as u32)
        .collect()
}

/// Train VanillaDCC or VolMaxDCC on `cons` and assign every row to its argmax cluster.
pub fn run<D: Device<f32>>(
    dev: &D,
    p: &DccParams,
    features: &Features,
    cons: &Constraints,
    monitor: &mut dyn Monitor,
) -> Result<DccTrained> {
    let mut c = Checker::new();
    check_net(
        &mut c,
        &p.hidden,
        p.epochs,
        p.batch_size,
        p.grad_clip,
        p.eps,
    );
    crate::check::require("dcc", c.done())?;
    cons.validate(features, false, "constraints artifact")?;
    if cons.is_empty() {
        return Err(StageError::input("no constraints to train on"));
    }
    let k = features.n_classes;
    let mut dims = vec![features.dim];
    dims.extend_from_slice(&p.hidden);
    dims.push(k);
    let bytes = memory_bytes(p, features.dim, k, features.rows());
    if let Some(problem) = crate::check::fits_in_memory("hidden", "this network", bytes) {
        crate::check::require("dcc", vec![problem])?;
    }
    let mut rng = Stream::new(p.seed, &["dcc", "init"]);
    let mut params = P::new(dev);
    let mlp = Mlp::new(
        &mut params,
        "classifier",
        &dims,
        Act::Relu,
        Act::Identity,
        WeightInit::Torch,
        0,
        &mut rng,
    )?;
    let b_raw: Option<ParamId> = match &p.optimizer {
        DccOptimizer::VolMax { b_diag, b_off, .. } => {
            let init: Vec<f32> = (0..k * k)
                .map(|i| if i / k == i % k { *b_diag } else { *b_off } as f32)
                .collect();
            Some(params.add_values("confusion.b_raw", k, k, &init, 1)?)
        }
        DccOptimizer::Adam { .. } => None,
    };
    enum Opt<D: Device<f32>> {
        Adam(Adam<f32, D>),
        Sgd(Sgd<f32, D>),
    }
    let mut opt = match &p.optimizer {
        DccOptimizer::Adam { lr } => Opt::Adam(Adam::new(&params, vec![*lr])?),
        DccOptimizer::VolMax { lr, b_lr, .. } => {
            Opt::Sgd(Sgd::with_groups(&params, vec![*lr, *b_lr], 0.0)?)
        }
    };
    let x = dev.upload(&features.x)?;
    let train = features.train_indices();
    let train_idx: Vec<u32> = train.iter().map(|&i| i as u32).collect();
    let train_dev = dev.upload_idx(&train_idx)?;
    let targets = dev.upload(&cons.y)?;
    let m = cons.len();
    let ones = dev.upload(&vec![1.0f32; m])?;
    let mut g = G::new(dev)?;
    let mut acc = dev.scalars(1)?;
    let mut batch_rng = Stream::new(p.seed, &["dcc", "batches"]);
    let mut vol_rng = Stream::new(p.seed, &["dcc", "volume"]);
    let mut stop = StopTracker::new(&p.stop);
    let mut curve = Vec::new();
    let bs = p.batch_size;
    let predict = |params: &P<D>| -> Result<Vec<u32>> {
        let logits = map_rows(
            dev,
            &x,
            features.dim,
            Rows::Idx(&train_dev, train.len()),
            EVAL_ROWS,
            k,
            &mut |g, xi| mlp.forward(g, params, xi, None),
        )?;
        Ok(argmax_rows(&dev.to_vec(&logits)?, k))
    };
    let mut y_ep = dev.zeros(m)?;
    for epoch in 0..p.epochs {
        let order = batch_rng.permutation(m);
        let mut rows_order = Vec::with_capacity(2 * m);
        for cb in order.chunks(bs) {
            rows_order.extend(cb.iter().map(|&i| cons.a[i as usize]));
            rows_order.extend(cb.iter().map(|&i| cons.b[i as usize]));
        }
        let order_dev = dev.upload_idx(&order)?;
        let rows_dev = dev.upload_idx(&rows_order)?;
        dev.gather_rows(&targets, 1, Ix::new(&order_dev, 0, m), &mut y_ep)?;
        dev.scalars_fill(&mut acc, 0.0)?;
        let n_batches = m.div_ceil(bs);
        for bi in 0..n_batches {
            let start = bi * bs;
            let n = (start + bs).min(m) - start;
            g.reset();
            params.zero_grads();
            let xi = g.input_rows(&x, features.dim, Ix::new(&rows_dev, 2 * start, 2 * n))?;
            let logits = mlp.forward(&mut g, &params, xi, None)?;
            let q = g.softmax(logits)?;
            let y = g.input_slice(&y_ep, start, n, 1)?;
            let w = g.input_slice(&ones, 0, n, 1)?;
            let bce = g.pair_cobce(&params, q, n, b_raw, y, w, p.eps, n as f64)?;
            let loss = match &p.optimizer {
                DccOptimizer::VolMax {
                    lambda: Some(lambda),
                    volume_rows,
                    volume_eps,
                    ..
                } if *lambda != 0.0 => {
                    let take = (*volume_rows).min(train.len());
                    let pick: Vec<u32> = vol_rng
                        .sample_without_replacement(train.len(), take)
                        .into_iter()
                        .map(|j| train[j as usize] as u32)
                        .collect();
                    let pick_dev = dev.upload_idx(&pick)?;
                    let xv = g.input_rows(&x, features.dim, Ix::new(&pick_dev, 0, take))?;
                    let lv = mlp.forward(&mut g, &params, xv, None)?;
                    let qv = g.softmax(lv)?;
                    let ld = g.logdet_gram(qv, *volume_eps)?;
                    g.sum(&[(bce, 1.0), (ld, -lambda)])?
                }
                _ => bce,
            };
            g.accumulate(loss, 0, 1.0, &mut acc, 0)?;
            g.backward(loss, &mut params)?;
            if let Some(c) = p.grad_clip {
                params.clip_grad_norm(c)?;
            }
            match &mut opt {
                Opt::Adam(o) => o.step(&mut params)?,
                Opt::Sgd(o) => o.step(&mut params)?,
            }
        }
        let loss = dev.scalars_to_vec(&acc)?[0] / n_batches as f64;
        if !loss.is_finite() {
            return Err(StageError::failed(format!(
                "training diverged at epoch {epoch} (non-finite loss; a volume term of a degenerate assignment matrix?)"
            )));
        }
        if stop.epoch_done(
            epoch,
            p.epochs,
            loss,
            predict(&params)?,
            &mut curve,
            monitor,
        ) {
            break;
        }
    }
    let all = map_rows(
        dev,
        &x,
        features.dim,
        Rows::All(features.rows()),
        EVAL_ROWS,
        k,
        &mut |g, xi| mlp.forward(g, &params, xi, None),
    )?;
    let cluster = argmax_rows(&dev.to_vec(&all)?, k);
    Ok(DccTrained {
        assignments: Assignments {
            ids: features.ids.clone(),
            is_test: features.is_test.clone(),
            is_val: features.is_val.clone(),
            label: features.labels.clone(),
            cluster,
        },
        curve,
    })
}

pub fn curve_to_parquet(curve: &[DccEpoch]) -> Result<Vec<u8>> {
    TableBuilder::new()
        .u32("epoch", curve.iter().map(|s| s.epoch).collect())
        .f64("loss", curve.iter().map(|s| s.loss).collect())
        .f64("changed", curve.iter().map(|s| s.changed).collect())
        .to_parquet()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assignment_stop_needs_consecutive_checks_below_tol() {
        let rule = AssignmentStop {
            tol: 0.1,
            consecutive: 2,
            min_epochs: 0,
        };
        let mut t = StopTracker::new(&rule);
        // First check: nothing to compare with.
        assert_eq!(
            t.observe(1, vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            (None, false)
        );
        // 2 of 10 changed: 0.2 ≥ 0.1.
        assert_eq!(
            t.observe(2, vec![1, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
            (Some(0.2), false)
        );
        // 0 changed: one check below.
        assert_eq!(
            t.observe(3, vec![1, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
            (Some(0.0), false)
        );
        // A change in between resets the count.
        assert!(!t.observe(4, vec![1, 1, 1, 1, 0, 0, 0, 0, 0, 0]).1);
        assert!(!t.observe(5, vec![1, 1, 1, 1, 0, 0, 0, 0, 0, 0]).1);
        assert!(t.observe(6, vec![1, 1, 1, 1, 0, 0, 0, 0, 0, 0]).1);
        // The reference code's rule: one check, not before epoch 10.
        let code = AssignmentStop {
            tol: 1e-3,
            consecutive: 1,
            min_epochs: 10,
        };
        let mut t = StopTracker::new(&code);
        t.observe(1, vec![0, 1]);
        assert!(!t.observe(2, vec![0, 1]).1, "too early");
        for e in 3..10 {
            assert!(!t.observe(e, vec![0, 1]).1);
        }
        assert!(t.observe(10, vec![0, 1]).1);
    }

    #[test]
    fn settings_checks_name_bad_fields() {
        let s = VolMaxSettings {
            lambdas: vec![0.1, -1.0],
            b_lr: 0.0,
            ..Default::default()
        };
        let fields: Vec<String> = s.check().into_iter().map(|p| p.field).collect();
        assert_eq!(fields, ["b_lr", "lambdas[1]"]);
        assert!(DccSettings::default().check().is_empty());
        assert!(VolMaxSettings::default().check().is_empty());
    }
}
