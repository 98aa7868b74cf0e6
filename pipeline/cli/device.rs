//! The compute device a run trains on: `--device auto|cpu|cuda[:N]` (or `$UPCC_DEVICE`).
//!
//! The choice is made once, before the DAG is built, because it names the numerics class of
//! every training-like node (`cpu-f32`, `cuda-f32-sm90`, …): results computed on one class
//! never answer for another.

use std::fmt;
use std::sync::Arc;

use upcc_nn::{Cpu, Device, DeviceInfo};

use crate::error::{CliError, Result};

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    /// A GPU when a driver and a device are present, else the CPU.
    Auto,
    Cpu,
    /// CUDA device N (after `CUDA_VISIBLE_DEVICES`).
    Cuda(usize),
}

impl DeviceRequest {
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        match s {
            "auto" | "" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" | "gpu" => Ok(DeviceRequest::Cuda(0)),
            _ => {
                if let Some(n) = s.strip_prefix("cuda:").or_else(|| s.strip_prefix("gpu:")) {
                    if let Ok(n) = n.parse::<usize>() {
                        return Ok(DeviceRequest::Cuda(n));
                    }
                }
                Err(CliError::user(format!("unknown device `{s}`"))
                    .hint("use --device auto, cpu, cuda or cuda:N (also $UPCC_DEVICE)"))
            }
        }
    }

    /// `--device`, else `$UPCC_DEVICE`, else auto.
    pub fn from_flag(flag: Option<&str>) -> Result<Self> {
        match flag {
            Some(s) => Self::parse(s),
            None => match std::env::var("UPCC_DEVICE") {
                Ok(v) => Self::parse(&v).map_err(|e| e.cause("from $UPCC_DEVICE")),
                Err(_) => Ok(DeviceRequest::Auto),
            },
        }
    }
}

/// The device training nodes run on.
#[derive(Clone)]
pub enum Compute {
    Cpu(Cpu),
    #[cfg(feature = "cuda")]
    Cuda(upcc_nn::Cuda),
}

impl fmt::Debug for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Compute({})", self.name())
    }
}

/// Run `$body` with `$d` bound to the concrete device of a [`Compute`].
#[macro_export]
macro_rules! on_device {
    ($c:expr, |$d:ident| $body:expr) => {
        match $c {
            $crate::device::Compute::Cpu($d) => $body,
            #[cfg(feature = "cuda")]
            $crate::device::Compute::Cuda($d) => $body,
        }
    };
}

impl Compute {
    pub fn cpu() -> Arc<Self> {
        Arc::new(Compute::Cpu(Cpu))
    }

    pub fn name(&self) -> String {
        on_device!(self, |d| Device::<f32>::name(d))
    }

    /// The numerics class of f32 training on this device (part of node keys).
    pub fn numerics(&self) -> String {
        on_device!(self, |d| Device::<f32>::numerics(d))
    }

    pub fn is_gpu(&self) -> bool {
        !matches!(self, Compute::Cpu(_))
    }

    /// Facts for provenance: GPU model, driver, CUDA and cuBLAS versions.
    pub fn info(&self) -> DeviceInfo {
        match self {
            Compute::Cpu(_) => DeviceInfo {
                name: "cpu".into(),
                numerics: self.numerics(),
                facts: vec![],
            },
            #[cfg(feature = "cuda")]
            Compute::Cuda(c) => c.info(),
        }
    }

    /// Resolve a request. `auto` without a usable GPU falls back to the CPU and says so once
    /// on stderr (unless `quiet`); an explicit `cuda` without one is an environment error.
    pub fn resolve(req: DeviceRequest, quiet: bool) -> Result<Arc<Self>> {
        match req {
            DeviceRequest::Cpu => Ok(Self::cpu()),
            DeviceRequest::Auto => match Self::open_cuda(0) {
                Ok(c) => Ok(c),
                Err(why) => {
                    if !quiet {
                        eprintln!("upcc: info: no usable GPU ({why}); computing on the CPU");
                    }
                    Ok(Self::cpu())
                }
            },
            DeviceRequest::Cuda(n) => Self::open_cuda(n).map_err(|why| {
                CliError::env(why).hint("use --device cpu (or auto) to compute on the CPU")
            }),
        }
    }

    #[cfg(feature = "cuda")]
    fn open_cuda(ordinal: usize) -> std::result::Result<Arc<Self>, String> {
        upcc_nn::Cuda::new(ordinal)
            .map(|c| Arc::new(Compute::Cuda(c)))
            .map_err(|e| e.to_string())
    }

    #[cfg(not(feature = "cuda"))]
    fn open_cuda(_ordinal: usize) -> std::result::Result<Arc<Self>, String> {
        Err(upcc_nn::DeviceError::NotBuilt.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_requests_parse_and_bad_ones_name_the_choices() {
        assert_eq!(DeviceRequest::parse("auto").unwrap(), DeviceRequest::Auto);
        assert_eq!(DeviceRequest::parse("cpu").unwrap(), DeviceRequest::Cpu);
        assert_eq!(
            DeviceRequest::parse("cuda").unwrap(),
            DeviceRequest::Cuda(0)
        );
        assert_eq!(
            DeviceRequest::parse("cuda:2").unwrap(),
            DeviceRequest::Cuda(2)
        );
        let e = DeviceRequest::parse("tpu").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("cuda:N"), "{e}");
    }

    #[test]
    fn the_cpu_names_its_numerics() {
        let c = Compute::cpu();
        assert_eq!(c.numerics(), "cpu-f32");
        assert!(!c.is_gpu());
    }
}
