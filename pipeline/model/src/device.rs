//! The compute device a run trains on: `--device auto|cpu|cuda[:N]` (or `$UPCC_DEVICE`).
//!
//! The choice is made once, before the DAG is built, because it names the numerics class of
//! every training-like node (`cpu-f32-avx512`, `cuda-f32-sm90-…`, …): results computed on one class
//! never answer for another.

use std::fmt;
use std::sync::Arc;

use upcc_nn::{Cpu, Device, DeviceInfo};

use crate::error::{Error, Result};

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
                Err(Error::user(format!("unknown device `{s}`"))
                    .hint("use --device auto, cpu, cuda or cuda:N (also $UPCC_DEVICE)"))
            }
        }
    }

    /// `--device` (`flag`), else `$UPCC_DEVICE` (`env`, as the command line read it), else
    /// auto.
    pub fn from_flag(flag: Option<&str>, env: Option<&str>) -> Result<Self> {
        match (flag, env) {
            (Some(s), _) => Self::parse(s),
            (None, Some(v)) => Self::parse(v).map_err(|e| e.cause("from $UPCC_DEVICE")),
            (None, None) => Ok(DeviceRequest::Auto),
        }
    }
}

/// The devices training nodes of a run compute on: the CPU, or one or more GPUs (the run's
/// GPU slots, in order).
pub enum Compute {
    Cpu(Cpu),
    #[cfg(feature = "cuda")]
    Cuda(Gpus),
    /// No device: only the numerics class a Slurm driver planned with (`upcc job
    /// --numerics`), for jobs whose node does not train.
    Planned(String),
}

/// The GPUs of a run: what probing them said (enough to plan: names, numerics class) and,
/// once a command that trains opens them, the devices themselves (kernels compiled once per
/// process).
#[cfg(feature = "cuda")]
pub struct Gpus {
    probes: Vec<upcc_nn::cuda::Probe>,
    opened: std::sync::OnceLock<std::result::Result<Vec<upcc_nn::Cuda>, upcc_nn::DeviceError>>,
}

#[cfg(feature = "cuda")]
impl Gpus {
    fn devices(&self) -> std::result::Result<&[upcc_nn::Cuda], &upcc_nn::DeviceError> {
        self.opened
            .get_or_init(|| {
                self.probes
                    .iter()
                    .map(|p| upcc_nn::Cuda::new(p.ordinal))
                    .collect()
            })
            .as_ref()
            .map(|v| v.as_slice())
    }
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

/// Why `auto` may compute on the CPU: there is no GPU at all (no driver, no visible device, a
/// binary without CUDA). `None` for every other failure: a GPU is there and broken, which
/// `auto` must not hide.
pub fn no_gpu_here(e: &upcc_nn::DeviceError) -> Option<String> {
    use upcc_nn::DeviceError as E;
    match e {
        E::NoDriver(_) | E::NoDevice(_) | E::NotBuilt => Some(e.to_string()),
        _ => None,
    }
}

/// The error for a GPU that is there but cannot be used: the reason as the backend gave it
/// (an NVRTC log keeps its lines), what to change, and the way to the CPU.
pub fn unusable_gpu(e: &upcc_nn::DeviceError) -> Error {
    let mut err = Error::env(format!("upcc cannot use the GPU: {e}"));
    if let Some(fix) = e.fix() {
        err = err.hint(fix.to_string());
    }
    err.hint("to compute on the CPU knowingly, pass --device cpu (or set UPCC_DEVICE=cpu)")
}

impl Compute {
    pub fn cpu() -> Arc<Self> {
        Arc::new(Compute::Cpu(Cpu))
    }

    /// Plan with `numerics` without a device.
    pub fn planned(numerics: &str) -> Arc<Self> {
        Arc::new(Compute::Planned(numerics.to_string()))
    }

    pub fn name(&self) -> String {
        match self {
            Compute::Cpu(_) => "cpu".into(),
            Compute::Planned(_) => "none".into(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .probes
                .iter()
                .map(|p| format!("cuda:{}", p.ordinal))
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
            Compute::Cuda(g) => g.probes[0].numerics(),
            Compute::Planned(n) => n.clone(),
        }
    }

    pub fn is_gpu(&self) -> bool {
        match self {
            Compute::Cpu(_) => false,
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => true,
            Compute::Planned(n) => n.starts_with("cuda"),
        }
    }

    /// Open the GPUs now (create their contexts, compile and load the kernels), so that a
    /// command that trains fails before it computes anything when they cannot be used.
    pub fn open(&self) -> Result<()> {
        match self {
            Compute::Cpu(_) | Compute::Planned(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g.devices().map(|_| ()).map_err(unusable_gpu),
        }
    }

    /// GPU memory budget in MiB of each GPU slot (empty on the CPU). Opens the GPUs.
    pub fn gpu_budgets_mb(&self) -> Vec<u64> {
        match self {
            Compute::Cpu(_) | Compute::Planned(_) => vec![],
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => match g.devices() {
                Ok(devs) => devs
                    .iter()
                    .map(|d| {
                        let free = d.memory().map(|(free, _)| free).unwrap_or(8 << 30);
                        (free as f64 * GPU_MEMORY_SHARE / 1048576.0) as u64
                    })
                    .collect(),
                Err(_) => vec![],
            },
        }
    }

    /// The device of a node placed on GPU slot `slot` (its own stream and cuBLAS handle).
    pub fn for_node(&self, slot: Option<usize>) -> upcc_nn::DResult<NodeCompute> {
        match self {
            Compute::Cpu(c) => {
                let _ = slot;
                Ok(NodeCompute::Cpu(*c))
            }
            Compute::Planned(n) => Err(upcc_nn::DeviceError::Unavailable {
                ordinal: 0,
                message: format!("this job planned with numerics class {n} has no device to train on"),
                fix: "run training nodes where their device is (upcc job opens it when the node trains)".into(),
            }),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => {
                let devs = g.devices().map_err(Clone::clone)?;
                Ok(NodeCompute::Cuda(
                    devs[slot.unwrap_or(0).min(devs.len() - 1)].fork()?,
                ))
            }
        }
    }

    /// Facts for provenance: GPU model, driver, CUDA, cuBLAS and NVRTC versions (of the first
    /// GPU).
    pub fn info(&self) -> DeviceInfo {
        match self {
            Compute::Cpu(_) | Compute::Planned(_) => DeviceInfo {
                name: self.name(),
                numerics: self.numerics(),
                facts: vec![],
            },
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => {
                let mut i = g.probes[0].info();
                i.name = self.name();
                i
            }
        }
    }

    /// Resolve a request, reading what the GPUs are without opening them (planning needs
    /// only their numerics class; commands that train call [`Compute::open`]).
    ///
    /// `auto` computes on the CPU only where there is no GPU (no driver, no visible device)
    /// and says so once on stderr (unless `quiet`: the JSON output names the device). A GPU
    /// that is visible but unusable (a library missing, ...) is an error under `auto` too,
    /// never a silent CPU run. `gpus` (from `--gpus`) lists the GPUs to spread nodes over.
    pub fn resolve(req: DeviceRequest, gpus: Option<&[usize]>, quiet: bool) -> Result<Arc<Self>> {
        match (req, gpus) {
            (DeviceRequest::Cpu, Some(_)) => Err(Error::user(
                "--gpus asks for GPUs but --device (or $UPCC_DEVICE) says cpu",
            )
            .hint("drop one of the two")),
            (DeviceRequest::Cpu, None) => Ok(Self::cpu()),
            (_, Some(list)) => Self::probe_cuda(list).map_err(|e| Self::cuda_error(&e)),
            (DeviceRequest::Auto, None) => match Self::probe_cuda(&[0]) {
                Ok(c) => Ok(c),
                Err(e) => match no_gpu_here(&e) {
                    Some(why) => {
                        if !quiet {
                            eprintln!("upcc: info: no GPU here ({why}); computing on the CPU");
                        }
                        Ok(Self::cpu())
                    }
                    None => Err(unusable_gpu(&e)),
                },
            },
            (DeviceRequest::Cuda(n), None) => {
                Self::probe_cuda(&[n]).map_err(|e| Self::cuda_error(&e))
            }
        }
    }

    /// An explicit request for a GPU that cannot be had.
    fn cuda_error(e: &upcc_nn::DeviceError) -> Error {
        match no_gpu_here(e) {
            Some(_) => {
                Error::env(e.to_string()).hint("use --device cpu (or auto) to compute on the CPU")
            }
            None => unusable_gpu(e),
        }
    }

    #[cfg(feature = "cuda")]
    fn probe_cuda(ordinals: &[usize]) -> std::result::Result<Arc<Self>, upcc_nn::DeviceError> {
        let probes = ordinals
            .iter()
            .map(|&o| upcc_nn::cuda::probe(o))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let first = probes[0].numerics();
        if let Some(p) = probes.iter().find(|p| p.numerics() != first) {
            return Err(upcc_nn::DeviceError::Unavailable {
                ordinal: p.ordinal,
                message: format!(
                    "GPUs of different kinds in one run (cuda:{} is {first}, cuda:{} is {}): their results would not be interchangeable",
                    probes[0].ordinal,
                    p.ordinal,
                    p.numerics()
                ),
                fix: "list GPUs of one kind in --gpus".into(),
            });
        }
        Ok(Arc::new(Compute::Cuda(Gpus {
            probes,
            opened: std::sync::OnceLock::new(),
        })))
    }

    #[cfg(not(feature = "cuda"))]
    fn probe_cuda(_ordinals: &[usize]) -> std::result::Result<Arc<Self>, upcc_nn::DeviceError> {
        Err(upcc_nn::DeviceError::NotBuilt)
    }
}

/// Parse `--gpus 0,1` (or `all`: every visible GPU).
pub fn parse_gpus(s: &str) -> Result<Vec<usize>> {
    if s.trim() == "all" {
        #[cfg(feature = "cuda")]
        {
            let n = upcc_nn::cuda::visible_devices();
            if n == 0 {
                return Err(Error::env("--gpus all: no CUDA device is visible"));
            }
            return Ok((0..n).collect());
        }
        #[cfg(not(feature = "cuda"))]
        return Err(Error::env(upcc_nn::DeviceError::NotBuilt.to_string()));
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let n = part.trim().parse::<usize>().map_err(|_| {
            Error::user(format!("--gpus `{s}`: `{part}` is not a GPU number"))
                .hint("list GPU numbers like `--gpus 0,1` (after CUDA_VISIBLE_DEVICES), or `all`")
        })?;
        if out.contains(&n) {
            return Err(Error::user(format!("--gpus `{s}` lists GPU {n} twice")));
        }
        out.push(n);
    }
    Ok(out)
}

/// What a numerics class is made of, part by part, in words (`upcc explain`, `upcc device`):
/// every part is something that changes the bits of a training node's outputs.
pub fn describe_numerics(class: &str) -> Vec<String> {
    let parts: Vec<&str> = class.split('-').collect();
    let mut out = Vec::new();
    match parts.first().copied() {
        Some("exact") => {
            out.push("exact: no floating-point training; any machine gives the same bits".into())
        }
        Some("cpu") => {
            out.push("cpu: trained on the CPU".into());
            if let Some(d) = parts.get(1) {
                out.push(format!("{d}: the precision of every tensor"));
            }
            match parts.get(2).copied() {
                Some(isa) => out.push(format!(
                    "{isa}: the instruction set gemm's kernels use ({}); each product's sum is split every {} terms, the same on every CPU model",
                    match isa {
                        "avx512" => "x86-64 AVX-512F, 16 lanes",
                        "fma" => "x86-64 AVX2 with FMA, 8 lanes",
                        "neon" => "AArch64 NEON",
                        "scalar" => "no vector kernels",
                        _ => "unknown to this upcc",
                    },
                    upcc_nn::cpu::K_BLOCK
                )),
                None => out.push(
                    "no instruction set: a class written before it was part of the class (its bits could differ between CPU models)".into(),
                ),
            }
            if let Some(kb) = parts.get(3).and_then(|p| p.strip_prefix("kb")) {
                out.push(format!(
                    "kb{kb}: products split every {kb} terms instead of {} (UPCC_TEST_K_BLOCK: a change of rounding alone, for measuring its effect)",
                    upcc_nn::cpu::K_BLOCK
                ));
            }
        }
        Some("cuda") => {
            out.push("cuda: trained on an NVIDIA GPU".into());
            for p in &parts[1..] {
                let text = if let Some(cc) = p
                    .strip_prefix("sm")
                    .filter(|s| s.chars().all(|c| c.is_ascii_digit()))
                {
                    let (major, minor) = cc.split_at(cc.len().saturating_sub(1));
                    format!("{p}: compute capability {major}.{minor}")
                } else if let Some(n) = p.strip_suffix("sm") {
                    format!("{p}: {n} streaming multiprocessors (cuBLAS picks its kernels by them)")
                } else if let Some(v) = p.strip_prefix("cublas") {
                    if v.starts_with("0.") {
                        format!("{p}: the soft GPU's cuBLAS {v} (a CPU emulation for tests, stages/nn/soft-gpu; no real cuBLAS has version 0)")
                    } else {
                        format!("{p}: cuBLAS {v}")
                    }
                } else if let Some(v) = p.strip_prefix("nvrtc") {
                    format!("{p}: NVRTC {v}, which compiles upcc's kernels")
                } else {
                    format!("{p}: the precision of every tensor")
                };
                out.push(text);
            }
        }
        _ => out.push(format!("{class}: not a class this upcc knows")),
    }
    out
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
    fn auto_falls_back_only_where_there_is_no_gpu() {
        use upcc_nn::DeviceError as E;
        for e in [
            E::NoDriver("libcuda.so could not be loaded".into()),
            E::NoDevice("the driver sees 0 CUDA devices".into()),
            E::NotBuilt,
        ] {
            assert!(no_gpu_here(&e).is_some(), "{e}");
        }
        let broken = E::Unavailable {
            ordinal: 0,
            message: "NVRTC 13.0 could not compile upcc's kernels for sm_90:\ncuda_kernels.cu(12): error: x".into(),
            fix: "use the NVRTC of the driver's toolkit".into(),
        };
        assert!(
            no_gpu_here(&broken).is_none(),
            "a visible but broken GPU is never hidden"
        );
        let err = unusable_gpu(&broken);
        assert_eq!(err.exit_code(), 1);
        assert!(
            err.message.contains("\ncuda_kernels.cu(12)"),
            "the log keeps its lines: {}",
            err.message
        );
        assert!(
            err.hints.iter().any(|h| h.contains("NVRTC")),
            "{:?}",
            err.hints
        );
        assert!(
            err.hints.iter().any(|h| h.contains("--device cpu")),
            "{:?}",
            err.hints
        );
        let fatal = E::Fatal {
            device: "cuda:0".into(),
            op: "gather",
            message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        assert!(no_gpu_here(&fatal).is_none());
    }

    #[test]
    fn the_cpu_names_its_numerics() {
        let c = Compute::cpu();
        assert_eq!(c.numerics(), format!("cpu-f32-{}", upcc_nn::cpu::cpu_isa()));
        let parts = describe_numerics(&c.numerics());
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert!(parts[2].contains("split every 512 terms"), "{parts:?}");
        let gpu = describe_numerics("cuda-f32-sm90-132sm-cublas13.1.0-nvrtc13.0");
        assert!(
            gpu.iter().any(|p| p == "sm90: compute capability 9.0"),
            "{gpu:?}"
        );
        assert!(
            gpu.iter().any(|p| p.starts_with("132sm: 132 streaming")),
            "{gpu:?}"
        );
        assert!(
            gpu.iter().any(|p| p == "cublas13.1.0: cuBLAS 13.1.0"),
            "{gpu:?}"
        );
        assert!(!c.is_gpu());
        assert!(c.gpu_budgets_mb().is_empty());
        assert!(matches!(c.for_node(Some(3)), Ok(NodeCompute::Cpu(_))));
    }
}
