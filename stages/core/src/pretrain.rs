//! `pretrain`: the SDAE protocol of DEC/DCC/SpherePair (implementation notes §3).
//!
//! Layer-wise denoising autoencoders d→500, 500→500, 500→2000, 2000→D: untied encoder and
//! linear decoder, weights U(±0.01), masking noise 0.2 on the input, ReLU + dropout 0.2 on
//! hidden codes, the last code L2-normalised ("Sphere" variant), loss 0.5·mean squared error,
//! SGD momentum 0.9 with lr 0.1·0.1^⌊epoch/100⌋, batch 256; each layer trains on the clean
//! codes of the previous one. Then the full autoencoder (encoder in order, decoders in reverse,
//! ReLUs between) is fine-tuned end to end on masked inputs, decoding from the normalised code.

use serde::{Deserialize, Serialize};
use upcc_nn::{masking_noise, Act, DResult, Device, Ix, Linear, Sgd, Stream, Var, WeightInit};

use crate::error::{Monitor, Result, StageError};
use crate::features::Features;
use crate::nets::{map_rows, step_lr, Autoencoder, Rows, EVAL_ROWS, G, P};
use crate::table::TableBuilder;

pub const VERSION: u32 = 1;
pub const SAFETENSORS_MEDIA_TYPE: &str = "application/vnd.safetensors";

/// What a spec may set for pretraining (defaults: the reference protocol).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PretrainSettings {
    pub hidden: Vec<usize>,
    pub layerwise_epochs: usize,
    pub finetune_epochs: usize,
    pub lr: f64,
    pub momentum: f64,
    /// Decay the learning rate by `lr_decay` every `lr_step` epochs.
    pub lr_step: usize,
    pub lr_decay: f64,
    pub batch_size: usize,
    /// Masking-noise probability on the inputs.
    pub corruption: f64,
    /// Dropout on hidden codes of the layer-wise DAEs.
    pub dropout: f64,
    /// Weights and biases start U(−init_range, init_range).
    pub init_range: f64,
    /// L2-normalise the code before decoding ("Sphere" SDAE; false for plain SDAE).
    pub normalize_code: bool,
}

impl crate::check::Check for PretrainSettings {
    fn check(&self) -> Vec<crate::check::Problem> {
        let mut c = crate::check::Checker::new();
        c.sizes("hidden", &self.hidden, true);
        // A lower bound (one input and one embedding unit): sizes that cannot fit anywhere.
        if let Some(p) = crate::check::fits_in_memory(
            "hidden",
            "an autoencoder of these sizes",
            crate::check::autoencoder_bytes(1, &self.hidden, 1, self.batch_size),
        ) {
            c.problems.push(p);
        }
        c.learning_rate("lr", self.lr);
        c.epochs("layerwise_epochs", self.layerwise_epochs, 0);
        c.epochs("finetune_epochs", self.finetune_epochs, 0);
        c.in_range("momentum", self.momentum, 0.0, 1.0, false);
        c.positive("lr_decay", self.lr_decay);
        c.at_least("batch_size", self.batch_size, 1);
        c.in_range("corruption", self.corruption, 0.0, 1.0, false);
        c.in_range("dropout", self.dropout, 0.0, 1.0, false);
        c.positive("init_range", self.init_range);
        c.done()
    }
}

/// Parameters of one pretraining node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PretrainParams {
    pub settings: PretrainSettings,
    pub embedding_dim: usize,
    pub seed: u64,
}

impl Default for PretrainSettings {
    fn default() -> Self {
        PretrainSettings {
            hidden: vec![500, 500, 2000],
            layerwise_epochs: 300,
            finetune_epochs: 500,
            lr: 0.1,
            momentum: 0.9,
            lr_step: 100,
            lr_decay: 0.1,
            batch_size: 256,
            corruption: 0.2,
            dropout: 0.2,
            init_range: 0.01,
            normalize_code: true,
        }
    }
}

/// One row of the loss curve.
pub struct CurvePoint {
    pub phase: String,
    pub layer: u32,
    pub epoch: u32,
    pub loss: f64,
}

/// Which part of the protocol a loop trains (for the curve, the messages and the streams),
/// for how many epochs, seeded how.
struct Phase {
    name: &'static str,
    layer: u32,
    label: String,
    epochs: usize,
    seed: u64,
}

/// What a loop trains on: `rows × dim` values on the device.
struct Data<'a, D: Device<f32>> {
    x: &'a D::Buf,
    dim: usize,
}

/// Maps a noisy batch to its reconstruction (may draw dropout masks from the stream).
type Reconstruct<'a, D> = dyn FnMut(&mut G<D>, &P<D>, Var, &mut Stream) -> DResult<Var> + 'a;

/// SGD with momentum and step decay on masked inputs of `data` (rows × dim, on the device),
/// reconstructing the clean input with 0.5·mean squared error. `reconstruct` maps the noisy
/// batch to its reconstruction (it may draw dropout masks from the stream it is given).
fn denoising_epochs<D: Device<f32>>(
    s: &PretrainSettings,
    phase: &Phase,
    data: Data<'_, D>,
    p: &mut P<D>,
    curve: &mut Vec<CurvePoint>,
    reconstruct: &mut Reconstruct<'_, D>,
    on_epoch: &mut dyn FnMut(u64, f64),
) -> Result<()> {
    let (seed, epochs, dim, data) = (phase.seed, phase.epochs, data.dim, data.x);
    let dev = p.device().clone();
    let rows = dev.len(data) / dim;
    let mut opt = Sgd::new(p, s.lr, s.momentum)?;
    let mut g = G::new(&dev)?;
    let mut acc = dev.scalars(1)?;
    let mut batch_rng = Stream::new(seed, &["pretrain", "batches", &phase.label]);
    let mut noise_rng = Stream::new(seed, &["pretrain", "noise", &phase.label]);
    for epoch in 0..epochs {
        opt.set_lr(step_lr(s.lr, s.lr_decay, s.lr_step, epoch));
        let order = batch_rng.permutation(rows);
        let order_dev = dev.upload_idx(&order)?;
        dev.scalars_fill(&mut acc, 0.0)?;
        let mut count = 0usize;
        for (bi, batch) in order.chunks(s.batch_size).enumerate() {
            let n = batch.len();
            g.reset();
            p.zero_grads();
            let xi = g.input_rows(data, dim, Ix::new(&order_dev, bi * s.batch_size, n))?;
            let noisy = g.mask(
                xi,
                &masking_noise::<f32>(n * dim, s.corruption, &mut noise_rng),
            )?;
            let recon = reconstruct(&mut g, p, noisy, &mut noise_rng)?;
            let loss = g.sq_error(recon, xi, 0.5 / (n * dim) as f64)?;
            g.accumulate(loss, 0, n as f64, &mut acc, 0)?;
            count += n;
            g.backward(loss, p)?;
            opt.step(p)?;
        }
        let sum = dev.scalars_to_vec(&acc)?[0];
        let mean = sum / count.max(1) as f64;
        if !mean.is_finite() {
            return Err(StageError::failed(format!(
                "pretrain ({} {}): loss diverged at epoch {epoch}",
                phase.name, phase.layer
            )));
        }
        curve.push(CurvePoint {
            phase: phase.name.into(),
            layer: phase.layer,
            epoch: epoch as u32,
            loss: mean,
        });
        on_epoch(epoch as u64 + 1, mean);
    }
    Ok(())
}

/// Result: the autoencoder weights (safetensors) and the loss curve (Parquet).
pub struct Pretrained {
    pub weights: Vec<u8>,
    pub curve: Vec<u8>,
    pub train_mse_before: f64,
    pub train_mse_after: f64,
    pub test_mse_after: f64,
}

/// Bytes a pretraining node needs: the autoencoder with its optimiser state and a
/// mini-batch's activations, and the data with its corrupted copy.
pub fn memory_bytes(s: &PretrainSettings, embedding_dim: usize, dim: usize, rows: usize) -> u128 {
    crate::check::autoencoder_bytes(dim, &s.hidden, embedding_dim, s.batch_size)
        .saturating_add(crate::check::f32_bytes(rows, dim).saturating_mul(2))
}

pub fn validate(params: &PretrainParams, input_dim: usize, rows: usize) -> Result<()> {
    let p = &params.settings;
    crate::check::require("pretrain", crate::check::Check::check(p))?;
    if params.embedding_dim == 0 {
        return Err(StageError::input("`embedding_dim` must be at least 1"));
    }
    let bytes = memory_bytes(p, params.embedding_dim, input_dim, rows);
    if let Some(problem) = crate::check::fits_in_memory("hidden", "this autoencoder", bytes) {
        return crate::check::require("pretrain", vec![problem]);
    }
    Ok(())
}

pub fn run<D: Device<f32>>(
    dev: &D,
    node: &PretrainParams,
    features: &Features,
    monitor: &mut dyn Monitor,
) -> Result<Pretrained> {
    validate(node, features.dim, features.rows())?;
    let params = &node.settings;
    let seed = node.seed;
    let train = features.train_indices();
    let test = features.test_indices();
    let (n_train, n_test) = (train.len(), test.len());
    let x_train = dev.upload(&features.gather(&train))?;
    let x_test = dev.upload(&features.gather(&test))?;
    let mut dims = vec![features.dim];
    dims.extend_from_slice(&params.hidden);
    dims.push(node.embedding_dim);
    let n_layers = dims.len() - 1;
    let total_epochs = (n_layers * params.layerwise_epochs + params.finetune_epochs) as u64;
    let mut done = 0u64;
    let mut curve = Vec::new();

    // The full autoencoder whose parameters the layer-wise stage fills in.
    let mut full = P::new(dev);
    let mut init_rng = Stream::new(seed, &["pretrain", "init"]);
    let ae = Autoencoder::new(
        &mut full,
        features.dim,
        &params.hidden,
        node.embedding_dim,
        WeightInit::Uniform(params.init_range),
        0,
        &mut init_rng,
    )?;
    let train_mse_before =
        ae.reconstruction_mse(&full, &x_train, features.dim, Rows::All(n_train))?;

    // Layer-wise denoising autoencoders.
    let mut codes: Option<D::Buf> = None;
    let mut in_dim = features.dim;
    for l in 0..n_layers {
        let out_dim = dims[l + 1];
        let last = l + 1 == n_layers;
        let label = l.to_string();
        let mut rng = Stream::new(seed, &["pretrain", "dae", &label]);
        let mut p = P::new(dev);
        let enc = Linear::new(
            &mut p,
            "enc",
            in_dim,
            out_dim,
            WeightInit::Uniform(params.init_range),
            0,
            &mut rng,
        )?;
        let dec = Linear::new(
            &mut p,
            "dec",
            out_dim,
            in_dim,
            WeightInit::Uniform(params.init_range),
            0,
            &mut rng,
        )?;
        let input = codes.as_ref().unwrap_or(&x_train);
        let phase = Phase {
            name: "layerwise",
            layer: l as u32,
            label: format!("dae-{l}"),
            epochs: params.layerwise_epochs,
            seed,
        };
        denoising_epochs(
            params,
            &phase,
            Data {
                x: input,
                dim: in_dim,
            },
            &mut p,
            &mut curve,
            &mut |g, p, noisy, rng| {
                let mut h =
                    enc.forward(g, p, noisy, if last { Act::Identity } else { Act::Relu })?;
                if last {
                    if params.normalize_code {
                        h = g.l2_normalize(h, 1e-12)?;
                    }
                } else if params.dropout > 0.0 {
                    let (r, c) = g.shape(h);
                    h = g.mask(h, &upcc_nn::dropout_mask::<f32>(r * c, params.dropout, rng))?;
                }
                dec.forward(g, p, h, Act::Identity)
            },
            &mut |done_here, mean| {
                monitor.progress(
                    done + done_here,
                    total_epochs,
                    &format!("layer {} epoch {done_here} loss {mean:.5}", l + 1),
                );
            },
        )?;
        done += params.layerwise_epochs as u64;
        // Copy into the full autoencoder: encoder layer l, decoder layer (n_layers-1-l).
        let dec_l = n_layers - 1 - l;
        full.set_from(ae.encoder.layers[l].weight, p.value(enc.weight))?;
        full.set_from(ae.encoder.layers[l].bias, p.value(enc.bias))?;
        full.set_from(ae.decoder.layers[dec_l].weight, p.value(dec.weight))?;
        full.set_from(ae.decoder.layers[dec_l].bias, p.value(dec.bias))?;
        // Clean codes (eval mode) feed the next layer.
        if !last {
            let next = map_rows(
                dev,
                input,
                in_dim,
                Rows::All(n_train),
                EVAL_ROWS,
                out_dim,
                &mut |g, xi| enc.forward(g, &p, xi, Act::Relu),
            )?;
            codes = Some(next);
            in_dim = out_dim;
        }
        monitor.log(&format!(
            "layer-wise DAE {} ({}→{}) done",
            l + 1,
            dims[l],
            dims[l + 1]
        ));
    }

    // End-to-end fine-tuning.
    let d = features.dim;
    let phase = Phase {
        name: "finetune",
        layer: n_layers as u32,
        label: "finetune".into(),
        epochs: params.finetune_epochs,
        seed,
    };
    denoising_epochs(
        params,
        &phase,
        Data {
            x: &x_train,
            dim: d,
        },
        &mut full,
        &mut curve,
        &mut |g, p, noisy, _| {
            let z = ae.encoder.forward(g, p, noisy, None)?;
            let code = if params.normalize_code {
                g.l2_normalize(z, 1e-12)?
            } else {
                z
            };
            ae.decoder.forward(g, p, code, None)
        },
        &mut |done_here, mean| {
            monitor.progress(
                done + done_here,
                total_epochs,
                &format!("fine-tune epoch {done_here} loss {mean:.5}"),
            );
        },
    )?;
    let train_mse_after = ae.reconstruction_mse(&full, &x_train, d, Rows::All(n_train))?;
    let test_mse_after = ae.reconstruction_mse(&full, &x_test, d, Rows::All(n_test))?;
    monitor.log(&format!("reconstruction MSE on train: {train_mse_before:.6} at init → {train_mse_after:.6}; test {test_mse_after:.6}"));
    let metadata = std::collections::BTreeMap::from([
        ("stage".to_string(), "pretrain".to_string()),
        ("architecture".to_string(), format!("{dims:?}")),
        (
            "normalize_code".to_string(),
            params.normalize_code.to_string(),
        ),
    ]);
    let weights = full.to_safetensors(&["encoder.", "decoder."], &metadata)?;
    let curve = TableBuilder::new()
        .str("phase", curve.iter().map(|c| c.phase.clone()).collect())
        .u32("layer", curve.iter().map(|c| c.layer).collect())
        .u32("epoch", curve.iter().map(|c| c.epoch).collect())
        .f64("loss", curve.iter().map(|c| c.loss).collect())
        .to_parquet()?;
    Ok(Pretrained {
        weights,
        curve,
        train_mse_before,
        train_mse_after,
        test_mse_after,
    })
}
