//! Named parameters with their gradients; names are hierarchical (`encoder.0.weight`) and
//! are also the safetensors names.

use std::collections::BTreeMap;

use crate::device::{DResult, Device, DeviceError};
use crate::rng::Stream;
use crate::scalar::Real;

/// Handle on one parameter tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamId(pub usize);

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug)]
pub enum Init {
    /// PyTorch's default for `nn.Linear`: U(±1/√fan_in) for weights and biases.
    TorchLinear { fan_in: usize },
    /// U(−r, r).
    Uniform(f64),
    /// A constant.
    Const(f64),
}

struct Entry<B> {
    name: String,
    rows: usize,
    cols: usize,
    value: B,
    grad: B,
    /// Whether `grad` holds this step's gradient (false after `zero_grads`: zeroing is lazy,
    /// the first write of a step overwrites instead of accumulating).
    grad_live: bool,
    group: usize,
}

/// Errors from loading parameters.
#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    #[error("weights file is not valid safetensors: {0}")]
    Format(String),
    #[error("weights file lacks tensor `{0}`")]
    Missing(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {found}, expected F32 or F64")]
    Dtype { name: String, found: String },
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// A set of parameters on one device.
pub struct Params<T: Real, D: Device<T>> {
    dev: D,
    entries: Vec<Entry<D::Buf>>,
}

impl<T: Real, D: Device<T>> Params<T, D> {
    pub fn new(dev: &D) -> Self {
        Params {
            dev: dev.clone(),
            entries: Vec::new(),
        }
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Add a rows×cols parameter in optimiser group `group` (groups get their own learning rate).
    pub fn add(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        init: Init,
        group: usize,
        rng: &mut Stream,
    ) -> DResult<ParamId> {
        let n = rows * cols;
        let data: Vec<T> = match init {
            Init::TorchLinear { fan_in } => {
                let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
                (0..n)
                    .map(|_| T::from_f64(rng.uniform_range(-bound, bound)))
                    .collect()
            }
            Init::Uniform(r) => (0..n)
                .map(|_| T::from_f64(rng.uniform_range(-r, r)))
                .collect(),
            Init::Const(c) => vec![T::from_f64(c); n],
        };
        self.add_values(name, rows, cols, &data, group)
    }

    /// Add a parameter with given values.
    pub fn add_values(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        data: &[T],
        group: usize,
    ) -> DResult<ParamId> {
        assert_eq!(
            data.len(),
            rows * cols,
            "parameter `{name}`: wrong number of values"
        );
        assert!(
            self.entries.iter().all(|e| e.name != name),
            "parameter `{name}` added twice"
        );
        self.entries.push(Entry {
            name: name.to_string(),
            rows,
            cols,
            value: self.dev.upload(data)?,
            grad: self.dev.zeros(rows * cols)?,
            grad_live: true,
            group,
        });
        Ok(ParamId(self.entries.len() - 1))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = ParamId> {
        (0..self.entries.len()).map(ParamId)
    }

    pub fn name(&self, id: ParamId) -> &str {
        &self.entries[id.0].name
    }

    pub fn shape(&self, id: ParamId) -> (usize, usize) {
        (self.entries[id.0].rows, self.entries[id.0].cols)
    }

    pub fn group(&self, id: ParamId) -> usize {
        self.entries[id.0].group
    }

    pub fn id_of(&self, name: &str) -> Option<ParamId> {
        self.entries
            .iter()
            .position(|e| e.name == name)
            .map(ParamId)
    }

    pub fn value(&self, id: ParamId) -> &D::Buf {
        &self.entries[id.0].value
    }

    /// This step's gradient (zeros if nothing was written since `zero_grads`).
    pub fn grad(&mut self, id: ParamId) -> DResult<&D::Buf> {
        self.settle(id)?;
        Ok(&self.entries[id.0].grad)
    }

    /// Gradient buffer to accumulate into (zeroed first if stale).
    pub fn grad_mut(&mut self, id: ParamId) -> DResult<&mut D::Buf> {
        self.settle(id)?;
        Ok(&mut self.entries[id.0].grad)
    }

    /// Gradient buffer for the backward pass, and whether it already holds this step's
    /// values (accumulate) or is stale (overwrite). Marks it live.
    pub fn grad_for_write(&mut self, id: ParamId) -> (&mut D::Buf, bool) {
        let e = &mut self.entries[id.0];
        let accumulate = e.grad_live;
        e.grad_live = true;
        (&mut e.grad, accumulate)
    }

    /// Value (read) and gradient (write, with accumulate flag) of one parameter.
    pub fn value_and_grad_for_write(&mut self, id: ParamId) -> (&D::Buf, &mut D::Buf, bool) {
        let e = &mut self.entries[id.0];
        let accumulate = e.grad_live;
        e.grad_live = true;
        (&e.value, &mut e.grad, accumulate)
    }

    fn settle(&mut self, id: ParamId) -> DResult<()> {
        let e = &mut self.entries[id.0];
        if !e.grad_live {
            self.dev.fill(&mut e.grad, T::ZERO)?;
            e.grad_live = true;
        }
        Ok(())
    }

    /// Zero every stale gradient (before an optimiser step or a norm).
    pub fn settle_grads(&mut self) -> DResult<()> {
        for i in 0..self.entries.len() {
            self.settle(ParamId(i))?;
        }
        Ok(())
    }

    /// Value and gradient at once (for optimisers; call `settle_grads` first).
    pub fn value_and_grad_mut(&mut self, id: ParamId) -> (&mut D::Buf, &D::Buf) {
        let e = &mut self.entries[id.0];
        debug_assert!(e.grad_live, "settle_grads before reading gradients");
        (&mut e.value, &e.grad)
    }

    /// Host copy of a parameter.
    pub fn to_host(&self, id: ParamId) -> DResult<Vec<T>> {
        self.dev.to_vec(&self.entries[id.0].value)
    }

    /// The single value of a 1×1 parameter.
    pub fn scalar(&self, id: ParamId) -> DResult<T> {
        Ok(self.to_host(id)?[0])
    }

    pub fn set_host(&mut self, id: ParamId, data: &[T]) -> DResult<()> {
        let e = &mut self.entries[id.0];
        assert_eq!(data.len(), e.rows * e.cols);
        self.dev.write(&mut e.value, data)
    }

    /// Copy a device buffer of the right length into a parameter's value.
    pub fn set_from(&mut self, id: ParamId, src: &D::Buf) -> DResult<()> {
        let e = &mut self.entries[id.0];
        let n = e.rows * e.cols;
        assert_eq!(self.dev.len(src), n, "parameter `{}`: wrong length", e.name);
        self.dev.copy_range(src, 0, &mut e.value, 0, n)
    }

    /// Start a new step: every gradient becomes stale (zeroed lazily).
    pub fn zero_grads(&mut self) {
        for e in &mut self.entries {
            e.grad_live = false;
        }
    }

    /// Global gradient norm over all parameters (f64, fixed order), read back.
    pub fn grad_norm(&mut self) -> DResult<f64> {
        self.settle_grads()?;
        let mut total = 0.0;
        for e in &self.entries {
            total += self.dev.sum_squares(&e.grad)?;
        }
        Ok(total.sqrt())
    }

    /// PyTorch's `clip_grad_norm_`: scale all gradients by max/(norm + 1e-6) when the norm
    /// exceeds `max_norm`, entirely on the device.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> DResult<()> {
        self.settle_grads()?;
        let mut grads: Vec<&mut D::Buf> = self.entries.iter_mut().map(|e| &mut e.grad).collect();
        self.dev.clip_grad_norm(&mut grads, max_norm)
    }

    /// Whether every parameter value is finite (reads the values back).
    pub fn all_finite(&self) -> DResult<bool> {
        for e in &self.entries {
            if !self.dev.to_vec(&e.value)?.iter().all(|v| v.is_finite()) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Device copies of every value (for early stopping's best weights).
    pub fn snapshot(&self) -> DResult<Vec<D::Buf>> {
        self.entries
            .iter()
            .map(|e| {
                let n = e.rows * e.cols;
                let mut b = self.dev.zeros(n)?;
                self.dev.copy_range(&e.value, 0, &mut b, 0, n)?;
                Ok(b)
            })
            .collect()
    }

    /// Put back values taken by [`Params::snapshot`], on the device.
    pub fn restore(&mut self, snapshot: &[D::Buf]) -> DResult<()> {
        assert_eq!(snapshot.len(), self.entries.len());
        for (e, s) in self.entries.iter_mut().zip(snapshot) {
            let n = e.rows * e.cols;
            self.dev.copy_range(s, 0, &mut e.value, 0, n)?;
        }
        Ok(())
    }

    /// Add N(0, std²) noise to the named parameters: the noise is drawn on the host from
    /// `rng` (the same stream on every device) and added on the device.
    pub fn perturb(&mut self, names: &[String], std: f64, rng: &mut Stream) -> DResult<()> {
        if std <= 0.0 {
            return Ok(());
        }
        for name in names {
            if let Some(id) = self.id_of(name) {
                let e = &mut self.entries[id.0];
                let n = e.rows * e.cols;
                let noise: Vec<T> = (0..n).map(|_| T::from_f64(std * rng.normal())).collect();
                let buf = self.dev.upload(&noise)?;
                self.dev.axpy(T::ONE, &buf, &mut e.value)?;
            }
        }
        Ok(())
    }

    /// Serialise the parameters whose names start with one of `prefixes` (all if empty) as
    /// safetensors, tensors sorted by name, with `metadata` in the header.
    pub fn to_safetensors(
        &self,
        prefixes: &[&str],
        metadata: &BTreeMap<String, String>,
    ) -> DResult<Vec<u8>> {
        let mut selected: Vec<&Entry<D::Buf>> = self
            .entries
            .iter()
            .filter(|e| prefixes.is_empty() || prefixes.iter().any(|p| e.name.starts_with(p)))
            .collect();
        selected.sort_by(|a, b| a.name.cmp(&b.name));
        let mut tensors = Vec::with_capacity(selected.len());
        for e in selected {
            let shape = if e.rows == 1 && e.cols == 1 {
                vec![1]
            } else {
                vec![e.rows, e.cols]
            };
            tensors.push((
                e.name.clone(),
                shape,
                T::to_le_bytes_vec(&self.dev.to_vec(&e.value)?),
            ));
        }
        Ok(crate::io::write_safetensors(
            tensors.into_iter(),
            T::DTYPE,
            metadata,
        ))
    }

    /// Load values by name from safetensors bytes; `rename` maps a parameter name to the
    /// name in the file (identity if it returns the name unchanged). Every selected
    /// parameter must be present with the right shape.
    pub fn load_safetensors(
        &mut self,
        bytes: &[u8],
        select: impl Fn(&str) -> Option<String>,
    ) -> Result<usize, ParamError> {
        let tensors = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| ParamError::Format(e.to_string()))?;
        let mut loaded = 0;
        for i in 0..self.entries.len() {
            let Some(file_name) = select(&self.entries[i].name) else {
                continue;
            };
            let view = tensors
                .tensor(&file_name)
                .map_err(|_| ParamError::Missing(file_name.clone()))?;
            let e = &self.entries[i];
            let expected = if e.rows == 1 && e.cols == 1 {
                vec![1]
            } else {
                vec![e.rows, e.cols]
            };
            if view.shape() != expected.as_slice() {
                return Err(ParamError::Shape {
                    name: file_name,
                    found: view.shape().to_vec(),
                    expected,
                });
            }
            let data: Vec<T> = match view.dtype() {
                safetensors::Dtype::F32 => f32::from_le_bytes_slice(view.data())
                    .into_iter()
                    .map(|v| T::from_f64(v as f64))
                    .collect(),
                safetensors::Dtype::F64 => f64::from_le_bytes_slice(view.data())
                    .into_iter()
                    .map(T::from_f64)
                    .collect(),
                other => {
                    return Err(ParamError::Dtype {
                        name: file_name,
                        found: format!("{other:?}"),
                    })
                }
            };
            self.dev.write(&mut self.entries[i].value, &data)?;
            loaded += 1;
        }
        Ok(loaded)
    }
}
