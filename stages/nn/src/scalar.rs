//! The element types the numeric code is written for: `f32` for training, `f64` for gradient
//! checks against finite differences.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A real scalar (f32 or f64).
pub trait Real:
    Copy
    + Send
    + Sync
    + 'static
    + Default
    + Debug
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    /// Name used in safetensors headers and numerics classes.
    const DTYPE: &'static str;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn tanh(self) -> Self;
    fn sqrt(self) -> Self;
    fn abs(self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn is_finite(self) -> bool;
    fn to_le_bytes_vec(values: &[Self]) -> Vec<u8>;
    fn from_le_bytes_slice(bytes: &[u8]) -> Vec<Self>;
}

macro_rules! impl_real {
    ($t:ty, $name:expr, $n:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const DTYPE: &'static str = $name;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline]
            fn min(self, other: Self) -> Self {
                <$t>::min(self, other)
            }
            #[inline]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            fn to_le_bytes_vec(values: &[Self]) -> Vec<u8> {
                let mut out = Vec::with_capacity(values.len() * $n);
                for v in values {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out
            }
            fn from_le_bytes_slice(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact($n)
                    .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk size")))
                    .collect()
            }
        }
    };
}

impl_real!(f32, "F32", 4);
impl_real!(f64, "F64", 8);

/// Numerically stable softplus: log(1 + e^x).
#[inline]
pub fn softplus<T: Real>(x: T) -> T {
    let v = x.to_f64();
    T::from_f64(v.max(0.0) + (-v.abs()).exp().ln_1p())
}

/// Logistic sigmoid, stable for large |x|.
#[inline]
pub fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_and_sigmoid_are_stable_at_extremes() {
        assert!((softplus(0.0f64) - 2f64.ln()).abs() < 1e-15);
        assert!((softplus(50.0f64) - 50.0).abs() < 1e-12);
        assert!(softplus(-800.0f64) >= 0.0);
        assert_eq!(sigmoid(1000.0f64), 1.0);
        assert_eq!(sigmoid(-1000.0f64), 0.0);
        assert!((sigmoid(0.3f64) + sigmoid(-0.3f64) - 1.0).abs() < 1e-15);
    }
}
