//! Optimisers with PyTorch's update rules.

use crate::device::{DResult, Device};
use crate::params::Params;
use crate::scalar::Real;

/// Adam (Kingma & Ba) as `torch.optim.Adam`, one learning rate per parameter group.
pub struct Adam<T: Real, D: Device<T>> {
    pub lrs: Vec<f64>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    step: u64,
    m: Vec<D::Buf>,
    v: Vec<D::Buf>,
}

impl<T: Real, D: Device<T>> Adam<T, D> {
    /// `lrs[g]` is the learning rate of parameter group g.
    pub fn new(params: &Params<T, D>, lrs: Vec<f64>) -> DResult<Self> {
        let dev = params.device();
        let m = params
            .ids()
            .map(|id| dev.zeros(dev.len(params.value(id))))
            .collect::<DResult<_>>()?;
        let v = params
            .ids()
            .map(|id| dev.zeros(dev.len(params.value(id))))
            .collect::<DResult<_>>()?;
        Ok(Adam {
            lrs,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 0,
            m,
            v,
        })
    }

    pub fn step(&mut self, params: &mut Params<T, D>) -> DResult<()> {
        self.step += 1;
        params.settle_grads()?;
        let dev = params.device().clone();
        for id in params.ids().collect::<Vec<_>>() {
            let lr = self.lrs[params.group(id)];
            let (p, g) = params.value_and_grad_mut(id);
            dev.adam(
                p,
                g,
                &mut self.m[id.0],
                &mut self.v[id.0],
                lr,
                self.beta1,
                self.beta2,
                self.eps,
                self.step,
            )?;
        }
        Ok(())
    }
}

/// SGD with momentum as `torch.optim.SGD(momentum=μ)` (no dampening, no Nesterov); plain SGD
/// with μ = 0. `lrs[g]` is the learning rate of parameter group g (`lr` sets them all).
pub struct Sgd<T: Real, D: Device<T>> {
    pub lrs: Vec<f64>,
    pub momentum: f64,
    first: bool,
    bufs: Vec<D::Buf>,
}

impl<T: Real, D: Device<T>> Sgd<T, D> {
    pub fn new(params: &Params<T, D>, lr: f64, momentum: f64) -> DResult<Self> {
        Self::with_groups(params, vec![lr], momentum)
    }

    /// One learning rate per parameter group.
    pub fn with_groups(params: &Params<T, D>, lrs: Vec<f64>, momentum: f64) -> DResult<Self> {
        let dev = params.device();
        let bufs = params
            .ids()
            .map(|id| dev.zeros(dev.len(params.value(id))))
            .collect::<DResult<_>>()?;
        Ok(Sgd {
            lrs,
            momentum,
            first: true,
            bufs,
        })
    }

    /// Set every group's learning rate (a schedule with one group).
    pub fn set_lr(&mut self, lr: f64) {
        self.lrs.iter_mut().for_each(|l| *l = lr);
    }

    pub fn step(&mut self, params: &mut Params<T, D>) -> DResult<()> {
        params.settle_grads()?;
        let dev = params.device().clone();
        for id in params.ids().collect::<Vec<_>>() {
            let lr = self.lrs[params.group(id).min(self.lrs.len() - 1)];
            let (p, g) = params.value_and_grad_mut(id);
            dev.sgd_momentum(p, g, &mut self.bufs[id.0], lr, self.momentum, self.first)?;
        }
        self.first = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Cpu;
    use crate::params::Init;
    use crate::rng::Stream;

    #[test]
    fn adam_first_steps_match_hand_computation() {
        // With a constant gradient g, Adam's bias-corrected step is lr·g/(|g| + eps') ≈ lr.
        let mut params: Params<f64, Cpu> = Params::new(&Cpu);
        let mut rng = Stream::new(0, &["t"]);
        let id = params
            .add("p", 1, 1, Init::Const(1.0), 0, &mut rng)
            .unwrap();
        let mut opt = Adam::new(&params, vec![0.1]).unwrap();
        for _ in 0..3 {
            params.zero_grads();
            params.grad_mut(id).unwrap()[0] = 2.0;
            opt.step(&mut params).unwrap();
        }
        let expect = 1.0 - 3.0 * 0.1 * 2.0 / (2.0 + 1e-8);
        assert!(
            (params.scalar(id).unwrap() - expect).abs() < 1e-9,
            "{}",
            params.scalar(id).unwrap()
        );
    }

    #[test]
    fn sgd_momentum_matches_torch_rule() {
        let mut params: Params<f64, Cpu> = Params::new(&Cpu);
        let mut rng = Stream::new(0, &["t"]);
        let id = params
            .add("p", 1, 1, Init::Const(0.0), 0, &mut rng)
            .unwrap();
        let mut opt = Sgd::new(&params, 0.1, 0.9).unwrap();
        // g = 1 each step: buf = 1, 1.9, 2.71 → p = −0.1, −0.29, −0.561
        for _ in 0..3 {
            params.zero_grads();
            params.grad_mut(id).unwrap()[0] = 1.0;
            opt.step(&mut params).unwrap();
        }
        assert!((params.scalar(id).unwrap() + 0.561).abs() < 1e-12);
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let mut params: Params<f64, Cpu> = Params::new(&Cpu);
        let mut rng = Stream::new(0, &["t"]);
        let a = params
            .add("a", 1, 2, Init::Const(0.0), 0, &mut rng)
            .unwrap();
        params.grad_mut(a).unwrap().copy_from_slice(&[3.0, 4.0]);
        assert!((params.grad_norm().unwrap() - 5.0).abs() < 1e-12);
        params.clip_grad_norm(1.0).unwrap();
        assert!((params.grad_norm().unwrap() - 1.0).abs() < 1e-6);
        // Below the maximum nothing changes.
        params.clip_grad_norm(2.0).unwrap();
        assert!((params.grad_norm().unwrap() - 1.0).abs() < 1e-6);
    }
}
