//! Errors of the stages, in two tiers: the user's (bad data or parameters) and the rest.

/// A stage failure.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Bad user data or parameters; the message names the file or field and the fix.
    #[error("{0}")]
    Input(String),
    /// Anything else.
    #[error("{0}")]
    Failed(String),
    /// The compute device failed (out of memory, a failed launch, no driver).
    #[error("device error: {0}")]
    Device(#[from] upcc_nn::DeviceError),
}

impl StageError {
    pub fn input(msg: impl Into<String>) -> Self {
        StageError::Input(msg.into())
    }
    pub fn failed(msg: impl Into<String>) -> Self {
        StageError::Failed(msg.into())
    }
}

pub type Result<T> = std::result::Result<T, StageError>;

/// How a long stage reports to whoever runs it (the engine's node log and progress bar).
pub trait Monitor {
    fn log(&mut self, message: &str);
    fn progress(&mut self, done: u64, total: u64, message: &str);
}

/// A monitor that drops everything (tests, benchmarks).
pub struct Silent;

impl Monitor for Silent {
    fn log(&mut self, _message: &str) {}
    fn progress(&mut self, _done: u64, _total: u64, _message: &str) {}
}
