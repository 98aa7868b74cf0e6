//! Errors of the stages, in two tiers: the user's (bad data or parameters) and the rest.

use std::fmt;

use crate::check::Problem;

/// Where in a data file a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPlace {
    /// The file as a whole (its format, its size).
    File,
    /// A text line (1-based, as editors count).
    Line(usize),
    /// A field of a text line (both 1-based).
    Cell { line: usize, column: usize },
    /// A record of a binary or columnar file (1-based).
    Row(usize),
}

impl fmt::Display for DataPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataPlace::File => Ok(()),
            DataPlace::Line(l) => write!(f, " line {l}"),
            DataPlace::Cell { line, column } => write!(f, " line {line}, column {column}"),
            DataPlace::Row(r) => write!(f, " row {r}"),
        }
    }
}

/// A stage failure. The first four variants are the user's to fix (the engine reports them
/// with exit code 2); the rest are not.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A data file the user gave is malformed: which file, where in it, what is wrong and how
    /// to fix it.
    #[error("`{file}`{place}: {message}")]
    Data {
        file: String,
        place: DataPlace,
        message: String,
    },
    /// Parameter values of one settings section that its checks refuse.
    #[error("{}", params_message(section, problems))]
    Params {
        section: String,
        problems: Vec<Problem>,
    },
    /// A stored or given table (Parquet) that cannot be read as `what`.
    #[error("{what}: {message}")]
    Table { what: String, message: String },
    /// Other bad user input: a dataset's labels and splits as a whole, constraints that do
    /// not fit the dataset. The message names the dataset or file and the fix.
    #[error("{0}")]
    Input(String),
    /// Anything else (a bug, a diverged training).
    #[error("{0}")]
    Failed(String),
    /// The compute device failed (out of memory, a failed launch, no driver).
    #[error("device error: {0}")]
    Device(#[from] upcc_nn::DeviceError),
}

fn params_message(section: &str, problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("`{section}.{}`: {}", p.field, p.message))
        .collect::<Vec<_>>()
        .join("; ")
}

impl StageError {
    pub fn input(msg: impl Into<String>) -> Self {
        StageError::Input(msg.into())
    }
    pub fn failed(msg: impl Into<String>) -> Self {
        StageError::Failed(msg.into())
    }
    /// A problem at `place` of data file `file`.
    pub fn data(file: &str, place: DataPlace, message: impl Into<String>) -> Self {
        StageError::Data {
            file: file.to_string(),
            place,
            message: message.into(),
        }
    }
    /// Whether the user can fix it by changing data or parameters.
    pub fn is_user(&self) -> bool {
        matches!(
            self,
            StageError::Data { .. }
                | StageError::Params { .. }
                | StageError::Table { .. }
                | StageError::Input(_)
        )
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
