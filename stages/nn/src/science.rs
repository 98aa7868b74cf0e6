//! The few scalar formulas of the paper that kernels evaluate element-wise (shared by every
//! backend's reference implementation and by the stages).

use crate::scalar::softplus;

/// softclip_ξ(u) = ξ⁻¹ softplus(ξu) − ξ⁻¹ softplus(ξ(u − 1)): a smooth map into (0, 1).
pub fn softclip(u: f64, xi: f64) -> f64 {
    (softplus(xi * u) - softplus(xi * (u - 1.0))) / xi
}

/// Eq. 10: y_cor = softclip(y + Δ̂), gap = |softclip(ŷ_oof) − y_cor|, w = (1 − gap)^γ.
pub fn screen(y: f64, delta: f64, y_oof: f64, xi: f64, gamma: f64) -> (f64, f64, f64) {
    let y_cor = softclip(y + delta, xi);
    let gap = (softclip(y_oof, xi) - y_cor).abs();
    let w = (1.0 - gap).max(0.0).powf(gamma);
    (y_cor, gap, w)
}

/// Eq. 11: y_BC = (y + n·y_cor)/(1 + n) with n = n0·w.
pub fn bayesian_confidence(y: f64, y_cor: f64, w: f64, n0: f64) -> f64 {
    let n = n0 * w;
    (y + n * y_cor) / (1.0 + n)
}

/// Huber loss of residual r with transition δ and its derivative. `smooth = false`: ½r² inside,
/// δ(|r| − ½δ) outside (PyTorch's `HuberLoss`); `smooth = true`: ½r²/δ inside, |r| − ½δ
/// outside (PyTorch's `SmoothL1Loss(beta=δ)`).
pub fn huber(r: f64, delta: f64, smooth: bool) -> (f64, f64) {
    let inside = r.abs() <= delta;
    match (smooth, inside) {
        (false, true) => (0.5 * r * r, r),
        (false, false) => (delta * (r.abs() - 0.5 * delta), delta * r.signum()),
        (true, true) => (0.5 * r * r / delta, r / delta),
        (true, false) => (r.abs() - 0.5 * delta, r.signum()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huber_forms_on_hand_computed_values() {
        // δ = 0.1: inside at r = 0.05, outside at r = −0.3.
        assert_eq!(huber(0.05, 0.1, false), (0.5 * 0.05 * 0.05, 0.05));
        let (h, d) = huber(-0.3, 0.1, false);
        assert!((h - 0.1 * (0.3 - 0.05)).abs() < 1e-15 && d == -0.1);
        let (h, d) = huber(0.05, 0.1, true);
        assert!((h - 0.0125).abs() < 1e-15 && (d - 0.5).abs() < 1e-15);
        let (h, d) = huber(-0.3, 0.1, true);
        assert!((h - 0.25).abs() < 1e-15 && d == -1.0);
        // Both are continuous at the transition.
        for smooth in [false, true] {
            let (a, _) = huber(0.1, 0.1, smooth);
            let (b, _) = huber(0.1 + 1e-12, 0.1, smooth);
            assert!((a - b).abs() < 1e-10);
        }
    }
}
