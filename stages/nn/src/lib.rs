//! upcc-nn: a small reverse-mode autodiff layer over exactly the ops the paper needs.
//!
//! Matrix products run on the `gemm` crate; everything numeric goes through the [`Device`]
//! trait (CPU here, CUDA in `cuda.rs`), so training code is the same on both. Every op's backward
//! pass is checked against central finite differences in f64 (`src/gradcheck.rs`).

pub mod check;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod graph;
pub mod io;
pub mod layers;
pub mod optim;
pub mod params;
pub mod rng;
pub mod scalar;
pub mod science;

pub use cpu::{Cpu, HostIdx};
#[cfg(feature = "cuda")]
pub use cuda::Cuda;
pub use device::{
    Act, CoBce, DResult, Device, DeviceError, DeviceInfo, GemmSpec, HuberL2, Ix, StudentT,
};
pub use graph::{Graph, Var};
pub use layers::{dropout_mask, masking_noise, Linear, Mlp, WeightInit};
pub use optim::{Adam, Sgd};
pub use params::{Init, ParamError, ParamId, Params};
pub use rng::Stream;
pub use scalar::{sigmoid, softplus, Real};

#[cfg(test)]
mod gradcheck;
