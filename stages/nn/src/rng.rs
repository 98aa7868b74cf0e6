//! Seeded random streams.
//!
//! Every stream is derived from (trial seed, stage name, the parameters that define the
//! stream) by hashing, never from a global RNG. The raw generator is ChaCha8 (a stable,
//! specified stream); the distributions below are written here, so that a bump of a random
//! library can never silently change results.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};

/// A deterministic random stream.
pub struct Stream {
    inner: ChaCha8Rng,
    cached_normal: Option<f64>,
}

impl Stream {
    /// Stream for `seed` and a list of labels (`["expert", "subset", "lv0.01"]`).
    pub fn new(seed: u64, labels: &[&str]) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"upcc-rng\n");
        h.update(&seed.to_le_bytes());
        for l in labels {
            h.update(&(l.len() as u64).to_le_bytes());
            h.update(l.as_bytes());
        }
        Stream {
            inner: ChaCha8Rng::from_seed(*h.finalize().as_bytes()),
            cached_normal: None,
        }
    }

    /// A child stream (for example one per epoch or per layer).
    pub fn child(&mut self, label: &str) -> Stream {
        let s = self.next_u64();
        Stream::new(s, &[label])
    }

    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform_range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let x = self.next_u64();
            let m = (x as u128) * (n as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Bernoulli(p).
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// Standard normal (Box–Muller, both values used).
    pub fn normal(&mut self) -> f64 {
        if let Some(v) = self.cached_normal.take() {
            return v;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        self.cached_normal = Some(r * t.sin());
        r * t.cos()
    }

    /// Fisher–Yates shuffle in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A random permutation of 0..n.
    pub fn permutation(&mut self, n: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        self.shuffle(&mut p);
        p
    }

    /// `k` distinct indices from 0..n, in random order.
    pub fn sample_without_replacement(&mut self, n: usize, k: usize) -> Vec<u32> {
        assert!(k <= n, "cannot draw {k} of {n}");
        let mut p: Vec<u32> = (0..n as u32).collect();
        for i in 0..k {
            let j = i + self.below((n - i) as u64) as usize;
            p.swap(i, j);
        }
        p.truncate(k);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_labels_same_stream_different_labels_different_stream() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, &["x", "y"]);
                move |_| s.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, &["x", "y"]);
                move |_| s.next_u64()
            })
            .collect();
        let mut c = Stream::new(7, &["xy"]);
        assert_eq!(a, b);
        assert_ne!(a[0], c.next_u64());
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut s = Stream::new(1, &["t"]);
        let mut counts = [0usize; 5];
        for _ in 0..50_000 {
            counts[s.below(5) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut s = Stream::new(3, &["n"]);
        let xs: Vec<f64> = (0..100_000).map(|_| s.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
    }

    #[test]
    fn sampling_without_replacement_is_distinct() {
        let mut s = Stream::new(5, &["w"]);
        let mut v = s.sample_without_replacement(100, 40);
        v.sort();
        v.dedup();
        assert_eq!(v.len(), 40);
    }
}
