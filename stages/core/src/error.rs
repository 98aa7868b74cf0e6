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

impl DataPlace {
    /// As JSON for tools: `{"line": 3}`, `{"line": 3, "column": 2}`, `{"row": 7}` or `{}`.
    pub fn to_json(self) -> serde_json::Value {
        use serde_json::json;
        match self {
            DataPlace::File => json!({}),
            DataPlace::Line(line) => json!({ "line": line }),
            DataPlace::Cell { line, column } => json!({ "line": line, "column": column }),
            DataPlace::Row(row) => json!({ "row": row }),
        }
    }
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
    /// The fields of a user error, as JSON for tools (`run --json` reports them beside the
    /// message): the file and place of bad data, the section and fields of refused
    /// parameters, the table that could not be read. `None` for errors that are only words.
    pub fn detail(&self) -> Option<serde_json::Value> {
        use serde_json::json;
        match self {
            StageError::Data {
                file,
                place,
                message,
            } => Some(
                json!({"kind": "data", "file": file, "place": place.to_json(), "message": message}),
            ),
            StageError::Params { section, problems } => Some(json!({
                "kind": "params",
                "section": section,
                "problems": problems
                    .iter()
                    .map(|p| json!({"field": p.field, "message": p.message}))
                    .collect::<Vec<_>>(),
            })),
            StageError::Table { what, message } => {
                Some(json!({"kind": "table", "what": what, "message": message}))
            }
            _ => None,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_errors_keep_their_fields_and_others_have_none() {
        let d = StageError::Data {
            file: "x.csv".into(),
            place: DataPlace::Cell { line: 3, column: 2 },
            message: "bad".into(),
        }
        .detail()
        .unwrap();
        assert_eq!(
            d,
            serde_json::json!({"kind": "data", "file": "x.csv", "place": {"line": 3, "column": 2}, "message": "bad"})
        );
        let p = StageError::Params {
            section: "train".into(),
            problems: vec![Problem::new("lr", "must be > 0")],
        }
        .detail()
        .unwrap();
        assert_eq!(p["section"], "train");
        assert_eq!(p["problems"][0]["field"], "lr");
        assert_eq!(DataPlace::Row(7).to_json(), serde_json::json!({"row": 7}));
        assert_eq!(DataPlace::File.to_json(), serde_json::json!({}));
        assert!(StageError::Failed("diverged".into()).detail().is_none());
        assert!(StageError::Input("labels".into()).detail().is_none());
    }
}
