//! Layers built from parameters: linear layers and MLPs (encoders, decoders, classifiers).

use crate::device::{Act, DResult, Device};
use crate::graph::{Graph, Var};
use crate::params::{Init, ParamId, Params};
use crate::rng::Stream;
use crate::scalar::Real;

/// A linear layer `y = x·Wᵀ + b` with W stored out×in (PyTorch's layout).
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub weight: ParamId,
    pub bias: ParamId,
    pub in_dim: usize,
    pub out_dim: usize,
}

impl Linear {
    /// Parameters `{name}.weight` and `{name}.bias`.
    pub fn new<T: Real, D: Device<T>>(
        params: &mut Params<T, D>,
        name: &str,
        in_dim: usize,
        out_dim: usize,
        init: WeightInit,
        group: usize,
        rng: &mut Stream,
    ) -> DResult<Self> {
        let (wi, bi) = match init {
            WeightInit::Torch => (
                Init::TorchLinear { fan_in: in_dim },
                Init::TorchLinear { fan_in: in_dim },
            ),
            WeightInit::Uniform(r) => (Init::Uniform(r), Init::Uniform(r)),
        };
        let weight = params.add(&format!("{name}.weight"), out_dim, in_dim, wi, group, rng)?;
        let bias = params.add(&format!("{name}.bias"), 1, out_dim, bi, group, rng)?;
        Ok(Linear {
            weight,
            bias,
            in_dim,
            out_dim,
        })
    }

    pub fn forward<T: Real, D: Device<T>>(
        &self,
        g: &mut Graph<T, D>,
        params: &Params<T, D>,
        x: Var,
        act: Act,
    ) -> DResult<Var> {
        g.linear(params, x, self.weight, Some(self.bias), act)
    }
}

/// How weights start.
#[derive(Clone, Copy, Debug)]
pub enum WeightInit {
    /// PyTorch's `nn.Linear` default.
    Torch,
    /// U(−r, r) for weights and biases (the SDAE protocol uses 0.01).
    Uniform(f64),
}

/// A stack of linear layers: `hidden_act` between layers, `out_act` after the last.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub layers: Vec<Linear>,
    pub hidden_act: Act,
    pub out_act: Act,
}

impl Mlp {
    /// Layers `{prefix}.0`, `{prefix}.1`, ... for `dims = [in, h1, ..., out]`.
    pub fn new<T: Real, D: Device<T>>(
        params: &mut Params<T, D>,
        prefix: &str,
        dims: &[usize],
        hidden_act: Act,
        out_act: Act,
        init: WeightInit,
        group: usize,
        rng: &mut Stream,
    ) -> DResult<Self> {
        assert!(
            dims.len() >= 2,
            "an MLP needs at least input and output sizes"
        );
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                Linear::new(
                    params,
                    &format!("{prefix}.{i}"),
                    w[0],
                    w[1],
                    init,
                    group,
                    rng,
                )
            })
            .collect::<DResult<_>>()?;
        Ok(Mlp {
            layers,
            hidden_act,
            out_act,
        })
    }

    pub fn in_dim(&self) -> usize {
        self.layers[0].in_dim
    }

    pub fn out_dim(&self) -> usize {
        self.layers.last().expect("non-empty").out_dim
    }

    /// Forward pass; with `dropout = Some((p, rng))`, inverted dropout with rate p follows
    /// every hidden activation (training mode).
    pub fn forward<T: Real, D: Device<T>>(
        &self,
        g: &mut Graph<T, D>,
        params: &Params<T, D>,
        x: Var,
        mut dropout: Option<(f64, &mut Stream)>,
    ) -> DResult<Var> {
        let mut h = x;
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            let act = if i == last {
                self.out_act
            } else {
                self.hidden_act
            };
            h = layer.forward(g, params, h, act)?;
            if i != last {
                if let Some((p, rng)) = dropout.as_mut() {
                    if *p > 0.0 {
                        let (rows, cols) = g.shape(h);
                        let mask = dropout_mask::<T>(rows * cols, *p, rng);
                        h = g.mask(h, &mask)?;
                    }
                }
            }
        }
        Ok(h)
    }
}

/// Inverted-dropout mask: 0 with probability p, 1/(1−p) otherwise.
pub fn dropout_mask<T: Real>(n: usize, p: f64, rng: &mut Stream) -> Vec<T> {
    let keep = T::from_f64(1.0 / (1.0 - p));
    (0..n)
        .map(|_| if rng.uniform() < p { T::ZERO } else { keep })
        .collect()
}

/// Masking noise: each element kept with probability 1−p, zeroed otherwise (no rescaling).
pub fn masking_noise<T: Real>(n: usize, p: f64, rng: &mut Stream) -> Vec<T> {
    (0..n)
        .map(|_| if rng.uniform() < p { T::ZERO } else { T::ONE })
        .collect()
}
