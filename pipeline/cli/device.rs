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

/// The devices training nodes of a run compute on: the CPU, or one or more GPUs (the run's
/// GPU slots, in order).
#[derive(Clone)]
pub enum Compute {
    Cpu(Cpu),
    #[cfg(feature = "cuda")]
    Cuda(Vec<upcc_nn::Cuda>),
}

impl fmt::Debug for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Compute({})", self.name())
    }
}

/// The device one node computes on.
pub enum NodeCompute {
    Cpu(Cpu),
    #[cfg(feature = "cuda")]
    Cuda(upcc_nn::Cuda),
}

/// Run `$body` with `$d` bound to the concrete device of a [`NodeCompute`].
#[macro_export]
macro_rules! on_device {
    ($c:expr, |$d:ident| $body:expr) => {
        match $c {
            $crate::device::NodeCompute::Cpu($d) => $body,
            #[cfg(feature = "cuda")]
            $crate::device::NodeCompute::Cuda($d) => $body,
        }
    };
}

/// Share of a GPU's free memory the executor hands out to nodes.
#[cfg(feature = "cuda")]
const GPU_MEMORY_SHARE: f64 = 0.9;

impl Compute {
    pub fn cpu() -> Arc<Self> {
        Arc::new(Compute::Cpu(Cpu))
    }

    pub fn name(&self) -> String {
        match self {
            Compute::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .iter()
                .map(Device::<f32>::name)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The numerics class of f32 training on these devices (part of node keys; every GPU of
    /// a run has the same one).
    pub fn numerics(&self) -> String {
        match self {
            Compute::Cpu(c) => Device::<f32>::numerics(c),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => Device::<f32>::numerics(&g[0]),
        }
    }

    pub fn is_gpu(&self) -> bool {
        !matches!(self, Compute::Cpu(_))
    }

    /// GPU memory budget in MiB of each GPU slot (empty on the CPU).
    pub fn gpu_budgets_mb(&self) -> Vec<u64> {
        match self {
            Compute::Cpu(_) => vec![],
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .iter()
                .map(|d| {
                    let free = d.memory().map(|(free, _)| free).unwrap_or(8 << 30);
                    (free as f64 * GPU_MEMORY_SHARE / 1048576.0) as u64
                })
                .collect(),
        }
    }

    /// The device of a node placed on GPU slot `slot` (its own stream and cuBLAS handle).
    pub fn for_node(&self, slot: Option<usize>) -> upcc_nn::DResult<NodeCompute> {
        match self {
            Compute::Cpu(c) => {
                let _ = slot;
                Ok(NodeCompute::Cpu(*c))
            }
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => Ok(NodeCompute::Cuda(
                g[slot.unwrap_or(0).min(g.len() - 1)].fork()?,
            )),
        }
    }

    /// Facts for provenance: GPU model, driver, CUDA and cuBLAS versions (of the first GPU).
    pub fn info(&self) -> DeviceInfo {
        match self {
            Compute::Cpu(_) => DeviceInfo {
                name: "cpu".into(),
                numerics: self.numerics(),
                facts: vec![],
            },
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => {
                let mut i = g[0].info();
                i.name = self.name();
                i
            }
        }
    }

    /// Resolve a request. `auto` without a usable GPU falls back to the CPU and says so once
    /// on stderr (unless `quiet`); an explicit `cuda` without one is an environment error.
    /// `gpus` (from `--gpus`) lists the GPUs to spread nodes over.
    pub fn resolve(req: DeviceRequest, gpus: Option<&[usize]>, quiet: bool) -> Result<Arc<Self>> {
        let env_err = |why: String| {
            CliError::env(why).hint("use --device cpu (or auto) to compute on the CPU")
        };
        match (req, gpus) {
            (DeviceRequest::Cpu, Some(_)) => Err(CliError::user(
                "--gpus asks for GPUs but --device (or $UPCC_DEVICE) says cpu",
            )
            .hint("drop one of the two")),
            (DeviceRequest::Cpu, None) => Ok(Self::cpu()),
            (_, Some(list)) => Self::open_cuda(list).map_err(env_err),
            (DeviceRequest::Auto, None) => match Self::open_cuda(&[0]) {
                Ok(c) => Ok(c),
                Err(why) => {
                    if !quiet {
                        eprintln!("upcc: info: no usable GPU ({why}); computing on the CPU");
                    }
                    Ok(Self::cpu())
                }
            },
            (DeviceRequest::Cuda(n), None) => Self::open_cuda(&[n]).map_err(env_err),
        }
    }

    #[cfg(feature = "cuda")]
    fn open_cuda(ordinals: &[usize]) -> std::result::Result<Arc<Self>, String> {
        let mut devs = Vec::new();
        for &o in ordinals {
            devs.push(upcc_nn::Cuda::new(o).map_err(|e| e.to_string())?);
        }
        let first = Device::<f32>::numerics(&devs[0]);
        if let Some(d) = devs.iter().find(|d| Device::<f32>::numerics(*d) != first) {
            return Err(format!(
                "GPUs of different architectures in one run ({} is {first}, {} is {}): their results would not be interchangeable; list GPUs of one kind in --gpus",
                Device::<f32>::name(&devs[0]),
                Device::<f32>::name(d),
                Device::<f32>::numerics(d)
            ));
        }
        Ok(Arc::new(Compute::Cuda(devs)))
    }

    #[cfg(not(feature = "cuda"))]
    fn open_cuda(_ordinals: &[usize]) -> std::result::Result<Arc<Self>, String> {
        Err(upcc_nn::DeviceError::NotBuilt.to_string())
    }
}

/// Parse `--gpus 0,1` (or `all`: every visible GPU).
pub fn parse_gpus(s: &str) -> Result<Vec<usize>> {
    if s.trim() == "all" {
        #[cfg(feature = "cuda")]
        {
            let n = upcc_nn::cuda::visible_devices();
            if n == 0 {
                return Err(CliError::env("--gpus all: no CUDA device is visible"));
            }
            return Ok((0..n).collect());
        }
        #[cfg(not(feature = "cuda"))]
        return Err(CliError::env(upcc_nn::DeviceError::NotBuilt.to_string()));
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let n = part.trim().parse::<usize>().map_err(|_| {
            CliError::user(format!("--gpus `{s}`: `{part}` is not a GPU number"))
                .hint("list GPU numbers like `--gpus 0,1` (after CUDA_VISIBLE_DEVICES), or `all`")
        })?;
        if out.contains(&n) {
            return Err(CliError::user(format!("--gpus `{s}` lists GPU {n} twice")));
        }
        out.push(n);
    }
    Ok(out)
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
    fn gpu_lists_parse_and_bad_ones_are_user_errors() {
        assert_eq!(parse_gpus("0,1").unwrap(), vec![0, 1]);
        assert_eq!(parse_gpus(" 2 ").unwrap(), vec![2]);
        assert_eq!(parse_gpus("0,x").unwrap_err().exit_code(), 2);
        assert_eq!(parse_gpus("1,1").unwrap_err().exit_code(), 2);
        let e = Compute::resolve(DeviceRequest::Cpu, Some(&[0]), true).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
    }

    #[test]
    fn the_cpu_names_its_numerics() {
        let c = Compute::cpu();
        assert_eq!(c.numerics(), "cpu-f32");
        assert!(!c.is_gpu());
        assert!(c.gpu_budgets_mb().is_empty());
        assert!(matches!(c.for_node(Some(3)), Ok(NodeCompute::Cpu(_))));
    }
}
