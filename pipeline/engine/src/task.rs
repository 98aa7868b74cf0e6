//! What a stage looks like to the engine: a [`Task`] that turns input bytes into output bytes.
//!
//! The engine hands a task verified input bytes and takes named output bytes back; it never
//! looks inside them. Stages therefore never touch the store or the executor.

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

/// Resources a node asks the local executor for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    /// Worker threads (the node runs inside a rayon pool of this size).
    pub threads: usize,
    /// Rough peak memory in MiB, for the memory slots.
    pub memory_mb: u64,
    /// Rough peak GPU memory in MiB; 0 for nodes that do not use a GPU. Nodes that ask for
    /// some share a GPU while their sum fits its budget.
    pub gpu_memory_mb: u64,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            threads: 1,
            memory_mb: 256,
            gpu_memory_mb: 0,
        }
    }
}

/// Why a task failed. The tier decides the exit code: input problems are the user's (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Bad user data or parameters discovered while running (NaN in a dataset, a constraint
    /// value outside [0, 1], ...). The message names the file or field and the fix.
    #[error("{0}")]
    Input(String),
    /// Anything else: a bug, an I/O failure, numerical breakdown.
    #[error("{0}")]
    Failed(String),
    /// The GPU the node ran on failed in a way that poisons it for the rest of the process
    /// (an illegal address, a failed launch): the executor schedules nothing more onto it.
    #[error("{0}")]
    DeviceLost(String),
    /// Bad user data or parameters, with the fields a tool can act on (the file and place,
    /// the section and fields) beside the message: `run --json` reports them.
    #[error("{message}")]
    InputDetail {
        message: String,
        detail: serde_json::Value,
    },
}

impl TaskError {
    pub fn is_user_error(&self) -> bool {
        matches!(self, TaskError::Input(_) | TaskError::InputDetail { .. })
    }

    /// The structured fields of the error, when it has them.
    pub fn detail(&self) -> Option<&serde_json::Value> {
        match self {
            TaskError::InputDetail { detail, .. } => Some(detail),
            _ => None,
        }
    }
}

/// A unit of work run by the engine.
pub trait Task: Send + Sync {
    fn run(&self, ctx: &mut TaskContext) -> Result<(), TaskError>;
}

/// An output produced by a task, before it is stored.
#[derive(Clone, Debug)]
pub struct PendingOutput {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub file_name: String,
}

/// Progress event sent from a running task to the executor's display.
#[derive(Clone, Debug)]
pub struct ProgressEvent {
    pub node: usize,
    pub done: u64,
    pub total: u64,
    pub message: String,
}

/// The task's view of its node: inputs, outputs, log, progress.
pub struct TaskContext {
    node: usize,
    node_id: String,
    inputs: BTreeMap<String, Arc<Vec<u8>>>,
    outputs: BTreeMap<String, PendingOutput>,
    summary: serde_json::Map<String, Value>,
    log: String,
    started: Instant,
    progress: Option<Sender<ProgressEvent>>,
    threads: usize,
    gpu: Option<usize>,
}

impl TaskContext {
    pub fn new(
        node: usize,
        node_id: &str,
        inputs: BTreeMap<String, Arc<Vec<u8>>>,
        progress: Option<Sender<ProgressEvent>>,
        threads: usize,
    ) -> Self {
        TaskContext {
            node,
            node_id: node_id.to_string(),
            inputs,
            outputs: BTreeMap::new(),
            summary: serde_json::Map::new(),
            log: String::new(),
            started: Instant::now(),
            progress,
            threads,
            gpu: None,
        }
    }

    /// The same context, on GPU slot `gpu` (an index into the run's GPU list).
    pub fn with_gpu(mut self, gpu: Option<usize>) -> Self {
        self.gpu = gpu;
        self
    }

    /// The GPU slot the executor assigned to this node (nodes that asked for GPU memory).
    pub fn gpu(&self) -> Option<usize> {
        self.gpu
    }

    /// The logical id of the node being computed.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Threads in this node's pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Verified bytes of input `name`.
    pub fn input(&self, name: &str) -> Result<&[u8], TaskError> {
        self.inputs.get(name).map(|b| b.as_slice()).ok_or_else(|| {
            TaskError::Failed(format!(
                "internal: node `{}` has no input `{name}`",
                self.node_id
            ))
        })
    }

    /// Whether an optional input was wired.
    pub fn has_input(&self, name: &str) -> bool {
        self.inputs.contains_key(name)
    }

    /// Record an output.
    pub fn put_output(&mut self, name: &str, bytes: Vec<u8>, media_type: &str, file_name: &str) {
        self.outputs.insert(
            name.to_string(),
            PendingOutput {
                bytes,
                media_type: media_type.to_string(),
                file_name: file_name.to_string(),
            },
        );
    }

    /// Record a small fact for the manifest's summary (sizes, accuracies, epochs).
    pub fn summary(&mut self, key: &str, value: impl Into<Value>) {
        self.summary.insert(key.to_string(), value.into());
    }

    /// Append a line to the node's log (stored with the manifest) and emit it to tracing.
    pub fn log(&mut self, message: impl AsRef<str>) {
        let line = format!(
            "[{:>9.3}s] {}\n",
            self.started.elapsed().as_secs_f64(),
            message.as_ref()
        );
        tracing::info!(node = %self.node_id, "{}", message.as_ref());
        self.log.push_str(&line);
    }

    /// Report progress of a long stage (epochs, say).
    pub fn progress(&self, done: u64, total: u64, message: impl Into<String>) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(ProgressEvent {
                node: self.node,
                done,
                total,
                message: message.into(),
            });
        }
    }

    /// Take what the task produced (used by the executor).
    pub fn into_parts(self) -> (BTreeMap<String, PendingOutput>, Value, String) {
        (self.outputs, Value::Object(self.summary), self.log)
    }
}
