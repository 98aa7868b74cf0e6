//! Networks shared by several stages: the autoencoder backbone (d-500-500-2000-D with a
//! mirror decoder), pair read-outs and batched evaluation helpers, all on a device `D`.

use upcc_nn::{Act, Device, Graph, Ix, Mlp, Params, Stream, WeightInit};

use crate::error::Result;

/// Parameters and graphs of the f32 networks every stage trains.
pub type P<D> = Params<f32, D>;
pub type G<D> = Graph<f32, D>;

/// Rows evaluated per forward pass when nothing is trained (the same on every device, so
/// results do not depend on it).
pub const EVAL_ROWS: usize = 2048;

/// Which rows of a device matrix to evaluate.
#[derive(Clone, Copy)]
pub enum Rows<'a, D: Device<f32>> {
    /// The first `n` rows.
    All(usize),
    /// Rows listed in an index vector of length `n`.
    Idx(&'a D::Idx, usize),
}

impl<D: Device<f32>> Rows<'_, D> {
    pub fn len(&self) -> usize {
        match self {
            Rows::All(n) | Rows::Idx(_, n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A constant input of rows start..end of this selection.
    fn input(
        &self,
        g: &mut G<D>,
        x: &D::Buf,
        dim: usize,
        start: usize,
        end: usize,
    ) -> Result<upcc_nn::Var> {
        Ok(match self {
            Rows::All(_) => g.input_slice(x, start, end - start, dim)?,
            Rows::Idx(idx, _) => g.input_rows(x, dim, Ix::new(*idx, start, end - start))?,
        })
    }
}

/// Evaluate `f` (input rows → output var of `out_cols` columns) over `rows` of `x` in chunks of
/// `chunk` rows, collecting the outputs in a device buffer (rows × out_cols).
pub fn map_rows<D: Device<f32>>(
    dev: &D,
    x: &D::Buf,
    dim: usize,
    rows: Rows<'_, D>,
    chunk: usize,
    out_cols: usize,
    f: &mut dyn FnMut(&mut G<D>, upcc_nn::Var) -> upcc_nn::DResult<upcc_nn::Var>,
) -> Result<D::Buf> {
    let n = rows.len();
    let mut out = dev.zeros(n * out_cols)?;
    let mut g = G::new(dev)?;
    for start in (0..n).step_by(chunk.max(1)) {
        let end = (start + chunk).min(n);
        g.reset();
        let xi = rows.input(&mut g, x, dim, start, end)?;
        let y = f(&mut g, xi)?;
        dev.copy_range(
            g.value(y),
            0,
            &mut out,
            start * out_cols,
            (end - start) * out_cols,
        )?;
    }
    Ok(out)
}

/// Encoder d→h1→…→D (ReLU hidden, linear code) and decoder D→…→d (ReLU hidden, linear out),
/// parameters `encoder.{i}.*` and `decoder.{i}.*`.
pub struct Autoencoder {
    pub encoder: Mlp,
    pub decoder: Mlp,
}

impl Autoencoder {
    pub fn new<D: Device<f32>>(
        params: &mut P<D>,
        input_dim: usize,
        hidden: &[usize],
        embedding_dim: usize,
        init: WeightInit,
        group: usize,
        rng: &mut Stream,
    ) -> Result<Self> {
        let mut dims = vec![input_dim];
        dims.extend_from_slice(hidden);
        dims.push(embedding_dim);
        let encoder = Mlp::new(
            params,
            "encoder",
            &dims,
            Act::Relu,
            Act::Identity,
            init,
            group,
            rng,
        )?;
        let rev: Vec<usize> = dims.iter().rev().copied().collect();
        let decoder = Mlp::new(
            params,
            "decoder",
            &rev,
            Act::Relu,
            Act::Identity,
            init,
            group,
            rng,
        )?;
        Ok(Autoencoder { encoder, decoder })
    }

    /// Normalised embeddings of `rows` of `x` (… × dim) on the device, no gradients.
    pub fn embed<D: Device<f32>>(
        &self,
        params: &P<D>,
        x: &D::Buf,
        dim: usize,
        rows: Rows<'_, D>,
    ) -> Result<D::Buf> {
        let d = self.encoder.out_dim();
        map_rows(params.device(), x, dim, rows, EVAL_ROWS, d, &mut |g, xi| {
            let z = self.encoder.forward(g, params, xi, None)?;
            g.l2_normalize(z, 1e-12)
        })
    }

    /// Mean squared reconstruction error of `rows` of `x` decoded from the normalised code.
    pub fn reconstruction_mse<D: Device<f32>>(
        &self,
        params: &P<D>,
        x: &D::Buf,
        dim: usize,
        rows: Rows<'_, D>,
    ) -> Result<f64> {
        let n = rows.len();
        if n == 0 {
            return Ok(f64::NAN);
        }
        let mut g = G::new(params.device())?;
        let mut total = 0.0;
        for start in (0..n).step_by(EVAL_ROWS) {
            let end = (start + EVAL_ROWS).min(n);
            g.reset();
            let xi = rows.input(&mut g, x, dim, start, end)?;
            let z = self.encoder.forward(&mut g, params, xi, None)?;
            let u = g.l2_normalize(z, 1e-12)?;
            let r = self.decoder.forward(&mut g, params, u, None)?;
            let l = g.sq_error(r, xi, 1.0)?;
            total += g.scalar(l)?;
        }
        Ok(total / (n * dim) as f64)
    }
}

/// Pairs (a_i, b_i) of data rows prepared for the device once: the distinct rows they touch
/// (sorted) and each pair's positions among them.
pub struct PairIndex<D: Device<f32>> {
    pub rows: D::Idx,
    pub n_rows: usize,
    pub pa: D::Idx,
    pub pb: D::Idx,
    pub n: usize,
}

impl<D: Device<f32>> PairIndex<D> {
    pub fn new(dev: &D, a: &[u32], b: &[u32]) -> Result<Self> {
        assert_eq!(a.len(), b.len());
        let mut rows: Vec<u32> = a.iter().chain(b).copied().collect();
        rows.sort_unstable();
        rows.dedup();
        let pos = |i: u32| rows.binary_search(&i).expect("row listed") as u32;
        let pa: Vec<u32> = a.iter().map(|&i| pos(i)).collect();
        let pb: Vec<u32> = b.iter().map(|&i| pos(i)).collect();
        Ok(PairIndex {
            rows: dev.upload_idx(&rows)?,
            n_rows: rows.len(),
            pa: dev.upload_idx(&pa)?,
            pb: dev.upload_idx(&pb)?,
            n: a.len(),
        })
    }
}

/// Softmax class probabilities of an MLP classifier for the first `rows` rows of `x`, in
/// batches (eval mode), read back to the host.
pub fn predict_proba<D: Device<f32>>(
    mlp: &Mlp,
    params: &P<D>,
    x: &D::Buf,
    dim: usize,
    rows: usize,
) -> Result<Vec<f32>> {
    let dev = params.device();
    let c = mlp.out_dim();
    let out = map_rows(dev, x, dim, Rows::All(rows), EVAL_ROWS, c, &mut |g, xi| {
        let logits = mlp.forward(g, params, xi, None)?;
        g.softmax_rows(logits)
    })?;
    Ok(dev.to_vec(&out)?)
}

/// Learning rate of step decay: lr · decay^⌊epoch/step⌋.
pub fn step_lr(lr: f64, decay: f64, step: usize, epoch: usize) -> f64 {
    match epoch.checked_div(step) {
        Some(k) => lr * decay.powi(k as i32),
        None => lr,
    }
}
