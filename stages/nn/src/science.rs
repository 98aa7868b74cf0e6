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

/// One soft-SpherePair pair term and its derivative in the cosine c: s⁺ = (c + 1)/2,
/// s⁻ = c², ℓ = −[y log s⁺ + (1 − y) log(1 − s⁻)], each log floored at −100 (PyTorch's BCE);
/// a floored log has no gradient.
pub fn spherepair_term(c: f64, y: f64) -> (f64, f64) {
    let sp = (c + 1.0) / 2.0;
    let sn = 1.0 - c * c;
    let (lp, dp) = if sp > 0.0 && sp.ln() > -100.0 {
        (sp.ln(), 1.0 / (c + 1.0))
    } else {
        (-100.0, 0.0)
    };
    let (ln, dn) = if sn > 0.0 && sn.ln() > -100.0 {
        (sn.ln(), -2.0 * c / sn)
    } else {
        (-100.0, 0.0)
    };
    (-(y * lp + (1.0 - y) * ln), -(y * dp + (1.0 - y) * dn))
}

/// log det and inverse of a symmetric positive definite c×c matrix (row-major) by Cholesky,
/// in f64; `None` if it is not positive definite.
pub fn cholesky_logdet_inverse(a: &[f64], c: usize) -> Option<(f64, Vec<f64>)> {
    let mut l = vec![0f64; c * c];
    for i in 0..c {
        for j in 0..=i {
            let mut sum = a[i * c + j];
            for k in 0..j {
                sum -= l[i * c + k] * l[j * c + k];
            }
            if i == j {
                if sum.is_nan() || sum <= 0.0 || !sum.is_finite() {
                    return None;
                }
                l[i * c + i] = sum.sqrt();
            } else {
                l[i * c + j] = sum / l[j * c + j];
            }
        }
    }
    let logdet = 2.0 * (0..c).map(|i| l[i * c + i].ln()).sum::<f64>();
    // inv = L⁻ᵀ L⁻¹: invert L (lower triangular), then multiply.
    let mut li = vec![0f64; c * c];
    for i in 0..c {
        li[i * c + i] = 1.0 / l[i * c + i];
        for j in 0..i {
            let mut sum = 0.0;
            for k in j..i {
                sum += l[i * c + k] * li[k * c + j];
            }
            li[i * c + j] = -sum / l[i * c + i];
        }
    }
    let mut inv = vec![0f64; c * c];
    for i in 0..c {
        for j in 0..c {
            let mut sum = 0.0;
            for k in i.max(j)..c {
                sum += li[k * c + i] * li[k * c + j];
            }
            inv[i * c + j] = sum;
        }
    }
    Some((logdet, inv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_gives_log_det_and_inverse() {
        // [[4, 2], [2, 3]]: det 8, inverse [[3, −2], [−2, 4]]/8.
        let (ld, inv) = cholesky_logdet_inverse(&[4.0, 2.0, 2.0, 3.0], 2).unwrap();
        assert!((ld - 8f64.ln()).abs() < 1e-12);
        let expect = [3.0 / 8.0, -2.0 / 8.0, -2.0 / 8.0, 4.0 / 8.0];
        for (a, b) in inv.iter().zip(expect) {
            assert!((a - b).abs() < 1e-12);
        }
        assert!(cholesky_logdet_inverse(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }

    #[test]
    fn soft_spherepair_terms_on_hand_computed_values() {
        // y = 1 at c = 0: −log(1/2); y = 0 at c = 0: −log 1 = 0, gradient 0.
        let (l, g) = spherepair_term(0.0, 1.0);
        assert!((l - 2f64.ln()).abs() < 1e-12 && (g + 1.0).abs() < 1e-12);
        let (l, g) = spherepair_term(0.0, 0.0);
        assert!(l.abs() < 1e-12 && g.abs() < 1e-12);
        // The single-pair optimum: cos θ = y/(2 − y) (the paper, App. C.2).
        let y: f64 = 0.6;
        let c = y / (2.0 - y);
        assert!(spherepair_term(c, y).1.abs() < 1e-9);
    }

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
