//! `train`: ProbPair and Weighted ProbPair (Section 4.1, Appendix C.2/C.5).
//!
//! Readout ŷ = σ((cos(z_a, z_b) − m)/T), m = tanh(m̃), T = softplus(T̃), initialised at
//! (m, T) = (0, 0.1) and trained with lr 1e-2; loss (1/|B|) Σ w_i BCE(y_i, ŷ_i) + λ·L_rec with
//! the reconstruction decoded from the normalised code; w_i = κ_i for Weighted ProbPair.
//! Constraint batches of 256 are paired with instance batches of ⌊N/⌈M/256⌉⌋ as in the
//! reference code; Adam 1e-3; global gradient-norm clipping at 1 (reference code).

use serde::{Deserialize, Serialize};
use upcc_nn::{softplus, Adam, Device, Init, Ix, ParamId, Stream, WeightInit};

use crate::constraints::Constraints;
use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{Autoencoder, PairIndex, Rows, G, P};
use crate::table::TableBuilder;

pub const VERSION: u32 = 1;

/// Per-constraint weights of the pairwise loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weighting {
    /// ProbPair: every constraint weighs 1.
    None,
    /// Weighted ProbPair: information-based decisiveness κ_i (Eq. 9).
    Kappa,
}

/// How the reconstruction error is reduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecReduction {
    /// Mean over batch and features (reference code; λ = 0.02 is calibrated to it).
    Mean,
    /// Sum over features, mean over samples (the paper's formula).
    Sum,
}

/// Whether the readout initial values are given for (m, T) or for the raw (m̃, T̃).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadoutInit {
    /// m = tanh(m̃) = m0, T = softplus(T̃) = t0.
    Value,
    /// m̃ = m0, T̃ = t0.
    Raw,
}

/// What a spec may set for ProbPair-style training (defaults: the paper's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSettings {
    pub hidden: Vec<usize>,
    pub epochs: usize,
    pub lr: f64,
    pub readout_lr: f64,
    pub batch_size: usize,
    pub lambda_rec: f64,
    pub rec_reduction: RecReduction,
    /// Global gradient-norm clip (None: no clipping).
    pub grad_clip: Option<f64>,
    pub readout_m0: f64,
    pub readout_t0: f64,
    pub readout_init: ReadoutInit,
}

impl crate::check::Check for TrainSettings {
    fn check(&self) -> Vec<crate::check::Problem> {
        let mut c = crate::check::Checker::new();
        c.sizes("hidden", &self.hidden, true);
        // A lower bound (one input and one embedding unit): sizes that cannot fit anywhere.
        // The field at fault: the sizes if they do not fit with the default batch, else the
        // batch (R11: a batch larger than the data was blamed on `hidden`).
        let bytes = |batch: usize| {
            crate::check::autoencoder_bytes(1, &self.hidden, 1, batch.saturating_mul(2))
        };
        let usual = self.batch_size.min(DEFAULT_BATCH_SIZE);
        if let Some(p) =
            crate::check::fits_in_memory("hidden", "an autoencoder of these sizes", bytes(usual))
                .or_else(|| {
                    crate::check::fits_in_memory(
                        "batch_size",
                        &format!("a batch of {} pairs", self.batch_size),
                        bytes(self.batch_size),
                    )
                })
        {
            c.problems.push(p);
        }
        c.epochs("epochs", self.epochs, 1);
        c.learning_rate("lr", self.lr);
        c.learning_rate("readout_lr", self.readout_lr);
        c.at_least("batch_size", self.batch_size, 1);
        c.non_negative("lambda_rec", self.lambda_rec);
        if let Some(g) = self.grad_clip {
            if !(g.is_finite() && g > 0.0) {
                c.push(
                    "grad_clip",
                    format!("must be a finite number > 0 (or null for no clipping), got {g}"),
                );
            }
        }
        match self.readout_init {
            ReadoutInit::Value => {
                if !(self.readout_m0.is_finite() && self.readout_m0 > -1.0 && self.readout_m0 < 1.0)
                {
                    c.push(
                        "readout_m0",
                        format!("must be in (−1, 1) (m = tanh(m̃)), got {}", self.readout_m0),
                    );
                }
                c.positive("readout_t0", self.readout_t0);
            }
            ReadoutInit::Raw => {
                if !self.readout_m0.is_finite() {
                    c.push("readout_m0", "must be finite");
                }
                if !self.readout_t0.is_finite() {
                    c.push("readout_t0", "must be finite");
                }
            }
        }
        c.done()
    }
}

/// The pairwise loss on the cosines of the normalised embeddings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairLoss {
    /// The ProbPair read-out σ((cos − m)/T) with BCE (Section 4.1).
    #[default]
    ProbPair,
    /// Soft SpherePair: s⁺ = (cos + 1)/2, s⁻ = cos², BCE with the real-valued y (App. C.2).
    SoftSpherePair,
}

/// Early stopping on the epoch's training loss (SpherePair; ProbPair trains a fixed budget).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossStop {
    /// The papers: after epoch `after`, stop once the relative change of the loss stays
    /// below `rel_tol` for `consecutive` epochs in a row.
    Plateau {
        after: usize,
        rel_tol: f64,
        consecutive: usize,
    },
    /// The SpherePair code: after epoch `after`, stop the first time the loss reaches a new
    /// minimum (its `tol = 0` rule; the plateau rule is commented out there).
    NewMinimum { after: usize },
}

/// Follows a [`LossStop`] rule across epochs.
pub struct LossStopTracker {
    rule: LossStop,
    prev: Option<f64>,
    min: f64,
    below: usize,
}

impl LossStopTracker {
    pub fn new(rule: &LossStop) -> Self {
        LossStopTracker {
            rule: rule.clone(),
            prev: None,
            min: f64::INFINITY,
            below: 0,
        }
    }

    /// The loss of epoch `epochs_done` (counting from 1): whether to stop now.
    pub fn observe(&mut self, epochs_done: usize, loss: f64) -> bool {
        let stop = match &self.rule {
            LossStop::Plateau {
                after,
                rel_tol,
                consecutive,
            } => {
                match self.prev {
                    Some(p) if ((loss - p) / p).abs() < *rel_tol => self.below += 1,
                    _ => self.below = 0,
                }
                epochs_done > *after && self.below >= *consecutive
            }
            LossStop::NewMinimum { after } => epochs_done > *after && loss < self.min,
        };
        self.prev = Some(loss);
        self.min = self.min.min(loss);
        stop
    }
}

/// Expert-aware ensemble member e: constraints of other experts weigh α (App. C.4).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Member {
    pub expert: u16,
    pub alpha: f64,
}

/// A member as wired: α may be chosen later by a selection node (None until then).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemberOf {
    pub expert: u16,
    pub alpha: Option<f64>,
}

/// α_i^(e): 1 for expert e's constraints, α for the others'.
pub fn member_weights(experts: &[u16], member: Member) -> Vec<f32> {
    experts
        .iter()
        .map(|&e| {
            if e == member.expert {
                1.0
            } else {
                member.alpha as f32
            }
        })
        .collect()
}

/// Parameters of one training node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainParams {
    pub settings: TrainSettings,
    pub weighting: Weighting,
    pub embedding_dim: usize,
    /// Start from the pretrained SDAE weights (the node then has a `weights` input).
    pub pretrained: bool,
    pub seed: u64,
    /// The pair loss (omitted from keys when ProbPair's).
    #[serde(skip_serializing_if = "is_probpair")]
    pub loss: PairLoss,
    /// Early stopping (none: the full budget of epochs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<LossStop>,
    /// Expert-aware ensemble member (none: one model on all constraints).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<MemberOf>,
}

fn is_probpair(l: &PairLoss) -> bool {
    *l == PairLoss::ProbPair
}

impl TrainParams {
    pub fn new(
        settings: TrainSettings,
        weighting: Weighting,
        embedding_dim: usize,
        pretrained: bool,
        seed: u64,
    ) -> Self {
        TrainParams {
            settings,
            weighting,
            embedding_dim,
            pretrained,
            seed,
            loss: PairLoss::ProbPair,
            stop: None,
            member: None,
        }
    }
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            hidden: vec![500, 500, 2000],
            epochs: 500,
            lr: 1e-3,
            readout_lr: 1e-2,
            batch_size: DEFAULT_BATCH_SIZE,
            lambda_rec: 0.02,
            rec_reduction: RecReduction::Mean,
            grad_clip: Some(1.0),
            readout_m0: 0.0,
            readout_t0: 0.1,
            readout_init: ReadoutInit::Value,
        }
    }
}

/// κ_i = KL(Bern(y_i) ‖ Bern(ȳ)) / [(1−y_i) KL(Bern(0) ‖ Bern(ȳ)) + y_i KL(Bern(1) ‖ Bern(ȳ))] (Eq. 9).
pub fn kappa(y: &[f32]) -> Vec<f32> {
    let ybar = y.iter().map(|&v| v as f64).sum::<f64>() / y.len().max(1) as f64;
    let ybar = ybar.clamp(1e-12, 1.0 - 1e-12);
    let xlogx = |p: f64, q: f64| if p <= 0.0 { 0.0 } else { p * (p / q).ln() };
    let kl = |p: f64| xlogx(p, ybar) + xlogx(1.0 - p, 1.0 - ybar);
    let kl0 = -(1.0 - ybar).ln();
    let kl1 = -ybar.ln();
    y.iter()
        .map(|&yi| {
            let yi = (yi as f64).clamp(0.0, 1.0);
            let den = (1.0 - yi) * kl0 + yi * kl1;
            if den <= 0.0 {
                0.0
            } else {
                (kl(yi) / den).clamp(0.0, 1.0) as f32
            }
        })
        .collect()
}

/// A ProbPair learner: autoencoder plus readout (m̃, T̃).
pub struct ProbPairModel<D: Device<f32>> {
    pub params: P<D>,
    pub ae: Autoencoder,
    pub m_raw: ParamId,
    pub t_raw: ParamId,
}

impl<D: Device<f32>> ProbPairModel<D> {
    /// Build with fresh (PyTorch-default) weights, then load `pretrained` if given.
    pub fn new(
        dev: &D,
        tp: &TrainParams,
        input_dim: usize,
        pretrained: Option<&[u8]>,
        rng: &mut Stream,
    ) -> Result<Self> {
        let p = &tp.settings;
        let mut params = P::new(dev);
        let ae = Autoencoder::new(
            &mut params,
            input_dim,
            &p.hidden,
            tp.embedding_dim,
            WeightInit::Torch,
            0,
            rng,
        )?;
        let (m0, t0) = match p.readout_init {
            ReadoutInit::Value => {
                if !(p.readout_m0 > -1.0 && p.readout_m0 < 1.0 && p.readout_t0 > 0.0) {
                    return Err(StageError::input(
                        "`train.readout_m0` must be in (−1, 1) and `train.readout_t0` positive",
                    ));
                }
                (p.readout_m0.atanh(), (p.readout_t0.exp() - 1.0).ln())
            }
            ReadoutInit::Raw => (p.readout_m0, p.readout_t0),
        };
        let m_raw = params.add("readout.m", 1, 1, Init::Const(m0), 1, rng)?;
        let t_raw = params.add("readout.t", 1, 1, Init::Const(t0), 1, rng)?;
        if let Some(bytes) = pretrained {
            let loaded = params
                .load_safetensors(bytes, |name| {
                    (name.starts_with("encoder.") || name.starts_with("decoder."))
                        .then(|| name.to_string())
                })
                .map_err(|e| match e {
                    upcc_nn::ParamError::Device(d) => StageError::Device(d),
                    e => {
                        StageError::input(format!("pretrained weights do not fit this model: {e}"))
                    }
                })?;
            if loaded == 0 {
                return Err(StageError::input(
                    "pretrained weights hold no encoder/decoder tensors",
                ));
            }
        }
        Ok(ProbPairModel {
            params,
            ae,
            m_raw,
            t_raw,
        })
    }

    /// Current (m, T), read back from the device.
    pub fn readout(&self) -> Result<(f64, f64)> {
        let m = (self.params.scalar(self.m_raw)? as f64).tanh();
        let t = softplus(self.params.scalar(self.t_raw)? as f64);
        Ok((m, t))
    }

    /// ŷ for the pairs of `pairs` (rows of the device matrix `x`), on the device, no
    /// gradients: the distinct rows are embedded in batches, then read out pair by pair.
    pub fn pair_probs(&self, x: &D::Buf, dim: usize, pairs: &PairIndex<D>) -> Result<D::Buf> {
        let dev = self.params.device();
        let emb = self
            .ae
            .embed(&self.params, x, dim, Rows::Idx(&pairs.rows, pairs.n_rows))?;
        let mut out = dev.zeros(pairs.n)?;
        dev.pair_readout(
            &emb,
            self.ae.encoder.out_dim(),
            Ix::new(&pairs.pa, 0, pairs.n),
            Ix::new(&pairs.pb, 0, pairs.n),
            self.params.value(self.m_raw),
            self.params.value(self.t_raw),
            &mut out,
        )?;
        Ok(out)
    }
}

/// One epoch's record.
#[derive(Clone, Debug)]
pub struct EpochStats {
    pub epoch: u32,
    pub loss: f64,
    pub pair_loss: f64,
    pub rec_loss: f64,
    pub m: f64,
    pub t: f64,
}

/// The constraints a trainer draws batches from: endpoints on the host (to compose each
/// epoch's row order once), targets and weights on the device (indexed by constraint id).
pub struct PairBatches<'a, D: Device<f32>> {
    pub a: &'a [u32],
    pub b: &'a [u32],
    /// Constraint ids this model trains on, ascending.
    pub ids: &'a [u32],
    pub targets: &'a D::Buf,
    pub weights: &'a D::Buf,
}

/// Mini-batch trainer of a ProbPair model on (targets, weights) over given constraints.
///
/// Per epoch the host draws the batch orders from the seeded stream and uploads them once
/// (the row order of every batch and the constraint order); targets and weights are gathered
/// on the device; losses accumulate in device slots and are read back once per epoch.
pub struct Trainer<D: Device<f32>> {
    /// The pair loss this trainer optimises.
    pub loss: PairLoss,
    opt: Adam<f32, D>,
    graph: G<D>,
    batch_rng: Stream,
    settings: TrainSettings,
    /// Training instances for the reconstruction term.
    instances: Vec<usize>,
    /// Loss sums of the epoch: pair, reconstruction, total.
    acc: D::Scalars,
    y_epoch: D::Buf,
    w_epoch: D::Buf,
}

impl<D: Device<f32>> Trainer<D> {
    pub fn new(
        model: &ProbPairModel<D>,
        p: &TrainSettings,
        x: &Features,
        seed: u64,
        rng_label: &str,
    ) -> Result<Self> {
        let dev = model.params.device();
        Ok(Trainer {
            loss: PairLoss::ProbPair,
            settings: p.clone(),
            instances: x.train_indices(),
            opt: Adam::new(&model.params, vec![p.lr, p.readout_lr])?,
            graph: G::new(dev)?,
            batch_rng: Stream::new(seed, &["train", "batches", rng_label]),
            acc: dev.scalars(3)?,
            y_epoch: dev.zeros(0)?,
            w_epoch: dev.zeros(0)?,
        })
    }

    /// One epoch over the constraints `data.ids` with their targets and weights, with the
    /// reference code's instance batching over the training instances; `x` is the feature
    /// matrix on the device (rows × dim).
    pub fn epoch(
        &mut self,
        model: &mut ProbPairModel<D>,
        x: &D::Buf,
        dim: usize,
        data: &PairBatches<'_, D>,
        epoch: u32,
    ) -> Result<EpochStats> {
        let dev = model.params.device().clone();
        let p = &self.settings;
        let instances = &self.instances;
        let m_total = data.ids.len();
        let bs = p.batch_size.max(1);
        let n_batches = m_total.div_ceil(bs).max(1);
        let inst_bs = instances.len() / n_batches;
        let cperm = self.batch_rng.permutation(m_total);
        let iperm = self.batch_rng.permutation(instances.len());
        let d = dim;
        let with_rec = inst_bs > 0 && p.lambda_rec != 0.0;
        // The epoch's orders, composed on the host and uploaded once.
        let order: Vec<u32> = cperm.iter().map(|&k| data.ids[k as usize]).collect();
        let mut rows_order: Vec<u32> = Vec::with_capacity(2 * m_total + n_batches * inst_bs);
        for bi in 0..n_batches {
            let cb = &order[bi * bs..((bi + 1) * bs).min(m_total)];
            rows_order.extend(cb.iter().map(|&k| data.a[k as usize]));
            rows_order.extend(cb.iter().map(|&k| data.b[k as usize]));
            let ib = &iperm[bi * inst_bs..(bi + 1) * inst_bs];
            rows_order.extend(ib.iter().map(|&k| instances[k as usize] as u32));
        }
        let order_dev = dev.upload_idx(&order)?;
        let rows_dev = dev.upload_idx(&rows_order)?;
        if dev.len(&self.y_epoch) != m_total {
            self.y_epoch = dev.zeros(m_total)?;
            self.w_epoch = dev.zeros(m_total)?;
        }
        let all = Ix::new(&order_dev, 0, m_total);
        dev.gather_rows(data.targets, 1, all, &mut self.y_epoch)?;
        dev.gather_rows(data.weights, 1, all, &mut self.w_epoch)?;
        dev.scalars_fill(&mut self.acc, 0.0)?;
        let g = &mut self.graph;
        let mut row_off = 0;
        for bi in 0..n_batches {
            let start = bi * bs;
            let n = ((bi + 1) * bs).min(m_total) - start;
            let n_inst = inst_bs;
            let rows = 2 * n + n_inst;
            g.reset();
            model.params.zero_grads();
            let xi = g.input_rows(x, d, Ix::new(&rows_dev, row_off, rows))?;
            row_off += rows;
            let z = model.ae.encoder.forward(g, &model.params, xi, None)?;
            let u = g.l2_normalize(z, 1e-12)?;
            let cos = g.pair_dot_blocks(u, 0, n, n)?;
            let y = g.input_slice(&self.y_epoch, start, n, 1)?;
            let w = g.input_slice(&self.w_epoch, start, n, 1)?;
            let pair = match self.loss {
                PairLoss::ProbPair => {
                    g.probpair_loss(&model.params, cos, model.m_raw, model.t_raw, y, w, n as f64)?
                }
                PairLoss::SoftSpherePair => g.spherepair_loss(cos, y, w, n as f64)?,
            };
            g.accumulate(pair, 0, 1.0, &mut self.acc, 0)?;
            let loss = if !with_rec {
                g.accumulate(pair, 0, 1.0, &mut self.acc, 2)?;
                pair
            } else {
                let ui = g.rows(u, 2 * n, rows)?;
                let recon = model.ae.decoder.forward(g, &model.params, ui, None)?;
                let scale = match p.rec_reduction {
                    RecReduction::Mean => 1.0 / (n_inst * d) as f64,
                    RecReduction::Sum => 1.0 / n_inst as f64,
                };
                let target = g.rows(xi, 2 * n, rows)?;
                let rec = g.sq_error(recon, target, scale)?;
                let total = g.sum(&[(pair, 1.0), (rec, p.lambda_rec)])?;
                g.accumulate(rec, 0, 1.0, &mut self.acc, 1)?;
                g.accumulate(total, 0, 1.0, &mut self.acc, 2)?;
                total
            };
            g.backward(loss, &mut model.params)?;
            if let Some(c) = p.grad_clip {
                model.params.clip_grad_norm(c)?;
            }
            self.opt.step(&mut model.params)?;
        }
        let sums = dev.scalars_to_vec(&self.acc)?;
        let (sum_pair, sum_rec, sum_loss) = (sums[0], sums[1], sums[2]);
        let nb = n_batches as f64;
        if !sum_loss.is_finite() {
            return Err(StageError::failed(format!(
                "training diverged at epoch {epoch} (non-finite loss)"
            )));
        }
        let (m, t) = model.readout()?;
        Ok(EpochStats {
            epoch,
            loss: sum_loss / nb,
            pair_loss: sum_pair / nb,
            rec_loss: sum_rec / nb,
            m,
            t,
        })
    }
}

/// Bytes a training node needs with `copies` autoencoders (ECI-PP trains K + 1) on `rows`
/// instances of `dim` features: each model with its optimiser state and the activations of a
/// mini-batch (two instances per pair), and the embeddings of every instance; plus the data.
pub fn memory_bytes(
    s: &TrainSettings,
    embedding_dim: usize,
    dim: usize,
    rows: usize,
    copies: usize,
) -> u128 {
    let one = crate::check::autoencoder_bytes(
        dim,
        &s.hidden,
        embedding_dim,
        s.batch_size.saturating_mul(2),
    )
    .saturating_add(crate::check::f32_bytes(rows, embedding_dim));
    one.saturating_mul(copies as u128)
        .saturating_add(crate::check::f32_bytes(rows, dim))
}

/// The checks of the settings, then the memory `copies` autoencoders on `rows` × `input_dim`
/// features need (ECI-PP trains K + 1 of them).
pub fn validate(tp: &TrainParams, input_dim: usize, rows: usize, copies: usize) -> Result<()> {
    let p = &tp.settings;
    crate::check::require("train", crate::check::Check::check(p))?;
    if tp.embedding_dim == 0 {
        return Err(StageError::input("`embedding_dim` must be at least 1"));
    }
    let bytes = memory_bytes(p, tp.embedding_dim, input_dim, rows, copies);
    let usual = TrainSettings {
        batch_size: p.batch_size.min(DEFAULT_BATCH_SIZE),
        ..p.clone()
    };
    let field = if crate::check::fits_in_memory(
        "hidden",
        "",
        memory_bytes(&usual, tp.embedding_dim, input_dim, rows, copies),
    )
    .is_none()
    {
        "batch_size"
    } else {
        "hidden"
    };
    if let Some(problem) = crate::check::fits_in_memory(field, "these networks", bytes) {
        return crate::check::require("train", vec![problem]);
    }
    Ok(())
}

/// The default pairs per mini-batch.
pub const DEFAULT_BATCH_SIZE: usize = 256;

/// Output of training: embeddings of every instance and the curve.
pub struct Trained {
    pub embeddings: Vec<f32>,
    pub dim: usize,
    pub curve: Vec<EpochStats>,
    /// Wall time per training epoch (for the benchmark).
    pub seconds_per_epoch: f64,
}

/// Train ProbPair / Weighted ProbPair on `constraints`.
pub fn run<D: Device<f32>>(
    dev: &D,
    p: &TrainParams,
    features: &Features,
    constraints: &Constraints,
    pretrained: Option<&[u8]>,
    monitor: &mut dyn Monitor,
) -> Result<Trained> {
    validate(p, features.dim, features.rows(), 1)?;
    constraints.validate(features, false, "constraints artifact")?;
    if constraints.is_empty() {
        return Err(StageError::input("no constraints to train on"));
    }
    let mut rng = Stream::new(p.seed, &["train", "init"]);
    let mut model = ProbPairModel::new(dev, p, features.dim, pretrained, &mut rng)?;
    let mut weights = match p.weighting {
        Weighting::None => vec![1.0; constraints.len()],
        Weighting::Kappa => kappa(&constraints.y),
    };
    if let Some(m) = p.member {
        let alpha = m
            .alpha
            .ok_or_else(|| StageError::failed("internal: an ensemble member runs without its α"))?;
        let member = Member {
            expert: m.expert,
            alpha,
        };
        for (w, a) in weights
            .iter_mut()
            .zip(member_weights(&constraints.expert, member))
        {
            *w *= a;
        }
    }
    let x = dev.upload(&features.x)?;
    let targets = dev.upload(&constraints.y)?;
    let weights = dev.upload(&weights)?;
    let ids: Vec<u32> = (0..constraints.len() as u32).collect();
    let data = PairBatches {
        a: &constraints.a,
        b: &constraints.b,
        ids: &ids,
        targets: &targets,
        weights: &weights,
    };
    let settings = &p.settings;
    let mut trainer = Trainer::new(&model, settings, features, p.seed, "probpair")?;
    trainer.loss = p.loss;
    let mut stop = p.stop.as_ref().map(LossStopTracker::new);
    let mut curve = Vec::new();
    let started = std::time::Instant::now();
    for epoch in 0..settings.epochs {
        let s = trainer.epoch(&mut model, &x, features.dim, &data, epoch as u32)?;
        monitor.progress(
            epoch as u64 + 1,
            settings.epochs as u64,
            &format!("loss {:.4} m {:.3} T {:.3}", s.loss, s.m, s.t),
        );
        let loss = s.loss;
        curve.push(s);
        if stop.as_mut().is_some_and(|t| t.observe(epoch + 1, loss)) {
            monitor.log(&format!(
                "early stop after {} epochs (loss {loss:.5})",
                epoch + 1
            ));
            break;
        }
    }
    dev.synchronize()?;
    if let Some(last) = curve.last() {
        monitor.log(&format!(
            "final loss {:.5} (pair {:.5}, rec {:.5}), m {:.4}, T {:.4}",
            last.loss, last.pair_loss, last.rec_loss, last.m, last.t
        ));
    }
    let seconds_per_epoch = started.elapsed().as_secs_f64() / curve.len().max(1) as f64;
    let emb = model
        .ae
        .embed(&model.params, &x, features.dim, Rows::All(features.rows()))?;
    Ok(Trained {
        embeddings: dev.to_vec(&emb)?,
        dim: p.embedding_dim,
        curve,
        seconds_per_epoch,
    })
}

pub fn embeddings_to_parquet(features: &Features, emb: &[f32], dim: usize) -> Result<Vec<u8>> {
    TableBuilder::new()
        .u32("id", features.ids.clone())
        .split3("split", &features.is_test, &features.is_val)
        .f32_rows("z", dim, emb.to_vec())
        .to_parquet()
}

pub fn curve_to_parquet(curve: &[EpochStats]) -> Result<Vec<u8>> {
    TableBuilder::new()
        .u32("epoch", curve.iter().map(|s| s.epoch).collect())
        .f64("loss", curve.iter().map(|s| s.loss).collect())
        .f64("pair_loss", curve.iter().map(|s| s.pair_loss).collect())
        .f64("rec_loss", curve.iter().map(|s| s.rec_loss).collect())
        .f64("m", curve.iter().map(|s| s.m).collect())
        .f64("t", curve.iter().map(|s| s.t).collect())
        .to_parquet()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_of_a_training_node_grows_with_its_copies_and_batch() {
        let s = TrainSettings::default();
        let one = memory_bytes(&s, 10, 784, 60_000, 1);
        let six = memory_bytes(&s, 10, 784, 60_000, 6);
        let data = crate::check::f32_bytes(60_000, 784);
        // ECI-PP's K + 1 autoencoders: six models and six embedding tables, one dataset.
        assert_eq!(six - data, 6 * (one - data));
        let wide = TrainSettings {
            batch_size: s.batch_size * 4,
            ..s.clone()
        };
        assert!(memory_bytes(&wide, 10, 784, 60_000, 1) > one);
    }

    #[test]
    fn kappa_is_one_at_the_ends_zero_at_the_mean_and_in_between_elsewhere() {
        // ȳ = 0.4 for this set.
        let y = [0.0, 1.0, 0.4, 0.4, 0.2];
        let k = kappa(&y);
        assert!((k[0] - 1.0).abs() < 1e-6 && (k[1] - 1.0).abs() < 1e-6);
        assert!(k[2].abs() < 1e-6);
        // Hand computation for y = 0.2, ȳ = 0.4:
        // KL = 0.2 ln(0.5) + 0.8 ln(0.8/0.6) = 0.0915; den = 0.8·(−ln 0.6) + 0.2·(−ln 0.4) = 0.5919.
        let kl = 0.2f64 * (0.5f64).ln() + 0.8 * (0.8f64 / 0.6).ln();
        let den = 0.8 * -(0.6f64).ln() + 0.2 * -(0.4f64).ln();
        assert!(
            (k[4] as f64 - kl / den).abs() < 1e-6,
            "{} vs {}",
            k[4],
            kl / den
        );
        assert!((k[4] as f64 - 0.154_6).abs() < 1e-3);
    }

    #[test]
    fn loss_stop_rules_on_hand_made_curves() {
        // Plateau: after epoch 2, relative change < 0.1 for 2 epochs in a row.
        let mut t = LossStopTracker::new(&LossStop::Plateau {
            after: 2,
            rel_tol: 0.1,
            consecutive: 2,
        });
        let stops: Vec<bool> = [1.0, 0.95, 0.93, 0.5, 0.48, 0.47]
            .iter()
            .enumerate()
            .map(|(i, &l)| t.observe(i + 1, l))
            .collect();
        // 0.95 (−5%), 0.93 (−2%): two below but epoch 3 > 2 → stop at epoch 3.
        assert_eq!(stops, [false, false, true, false, false, true]);
        // New minimum (the SpherePair code): the first new minimum after epoch 2.
        let mut t = LossStopTracker::new(&LossStop::NewMinimum { after: 2 });
        let stops: Vec<bool> = [1.0, 0.9, 0.95, 0.97, 0.85]
            .iter()
            .enumerate()
            .map(|(i, &l)| t.observe(i + 1, l))
            .collect();
        assert_eq!(stops, [false, false, false, false, true]);
    }

    #[test]
    fn member_weights_are_one_for_the_own_expert_and_alpha_otherwise() {
        let w = member_weights(
            &[0, 1, 2, 1],
            Member {
                expert: 1,
                alpha: 0.05,
            },
        );
        assert_eq!(w, [0.05, 1.0, 0.05, 1.0]);
        // α = 1: every member trains on the merged constraints alike.
        assert_eq!(
            member_weights(
                &[0, 1],
                Member {
                    expert: 0,
                    alpha: 1.0
                }
            ),
            [1.0, 1.0]
        );
    }

    #[test]
    fn readout_starts_at_m0_t0() {
        let s = TrainSettings {
            hidden: vec![4],
            ..Default::default()
        };
        let p = TrainParams::new(s.clone(), Weighting::None, 2, false, 0);
        let mut rng = Stream::new(0, &["t"]);
        let model = ProbPairModel::new(&upcc_nn::Cpu, &p, 3, None, &mut rng).unwrap();
        let (m, t) = model.readout().unwrap();
        assert!(m.abs() < 1e-7 && (t - 0.1).abs() < 1e-6, "{m} {t}");
        let raw = TrainParams::new(
            TrainSettings {
                readout_init: ReadoutInit::Raw,
                ..s
            },
            Weighting::None,
            2,
            false,
            0,
        );
        let model = ProbPairModel::new(&upcc_nn::Cpu, &raw, 3, None, &mut rng).unwrap();
        assert!((model.readout().unwrap().1 - softplus(0.1)).abs() < 1e-6);
    }
}
