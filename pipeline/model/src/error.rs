//! Errors of the command line, with the tier that decides the exit code and `hint:` lines.

use std::fmt;

pub use upcc_engine::Tier;

/// Where a problem with the user's input is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Place {
    /// A line of a spec file.
    Line { file: String, line: usize },
    /// A spec file, where no line could be told.
    File { file: String },
    /// A `--set` argument (as given).
    Set { arg: String },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Line { file, line } => write!(f, "{file}:{line}"),
            Place::File { file } => write!(f, "{file}"),
            Place::Set { arg } => write!(f, "`--set {arg}`"),
        }
    }
}

/// One located problem with the user's input: where, which field (dotted path), what is
/// wrong, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub place: Place,
    pub field: String,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.message)
    }
}

/// An error to show the user: the tier (which decides the exit code), the message, the located
/// problems (all of a spec's at once), the chain of causes and hints.
#[derive(Debug)]
pub struct Error {
    pub tier: Tier,
    pub message: String,
    pub problems: Vec<Problem>,
    pub causes: Vec<String>,
    pub hints: Vec<String>,
}

impl Error {
    fn new(tier: Tier, message: String) -> Self {
        Error {
            tier,
            message,
            problems: vec![],
            causes: vec![],
            hints: vec![],
        }
    }
    pub fn user(message: impl Into<String>) -> Self {
        Self::new(Tier::User, message.into())
    }
    pub fn env(message: impl Into<String>) -> Self {
        Self::new(Tier::Environment, message.into())
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Tier::Internal, message.into())
    }
    /// The problems of a spec (`display`): one is the message itself, several are listed.
    pub fn problems(display: &str, problems: Vec<Problem>) -> Self {
        let mut e = if let [p] = problems.as_slice() {
            let mut e = Self::user(p.to_string());
            e.hints.extend(p.hint.clone());
            e
        } else {
            Self::user(format!("{display} has {} problems", problems.len()))
        };
        e.problems = problems;
        e
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }
    pub fn cause(mut self, cause: impl Into<String>) -> Self {
        self.causes.push(cause.into());
        self
    }
    pub fn exit_code(&self) -> i32 {
        self.tier.exit_code()
    }
    /// The error as `--json` prints it on stdout.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "tier": match self.tier {
                    Tier::User => "user",
                    Tier::Environment => "environment",
                    Tier::Internal => "internal",
                },
                "exit_code": self.exit_code(),
                "message": self.message,
                "problems": self.problems,
                "causes": self.causes,
                "hints": self.hints,
            }
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        if self.problems.len() > 1 {
            for p in &self.problems {
                match &p.hint {
                    Some(h) => writeln!(f, "  Caused by: {p} ({h})")?,
                    None => writeln!(f, "  Caused by: {p}")?,
                }
            }
        }
        for c in &self.causes {
            writeln!(f, "  Caused by: {c}")?;
        }
        for h in &self.hints {
            writeln!(f, "hint: {h}")?;
        }
        Ok(())
    }
}

impl From<upcc_engine::EngineError> for Error {
    fn from(e: upcc_engine::EngineError) -> Self {
        Error::new(e.tier(), e.to_string())
    }
}

impl From<upcc_engine::StoreError> for Error {
    fn from(e: upcc_engine::StoreError) -> Self {
        let tier = match e {
            upcc_engine::StoreError::NotAStore(_)
            | upcc_engine::StoreError::LayoutVersion { .. } => Tier::User,
            _ => Tier::Environment,
        };
        let hint = match &e {
            upcc_engine::StoreError::BadJson { path, .. }
                if path.file_name().is_some_and(|n| n == "STORE.json") =>
            {
                Some(format!(
                    "`{}` is damaged and its folder has no store folders (objects/, nodes/, refs/) to rebuild it from: if this is not a store, choose another --store; if it is a new one, delete `STORE.json`",
                    path.display()
                ))
            }
            upcc_engine::StoreError::Io { path, source }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Some(upcc_engine::fsutil::permission_note(path)).filter(|n| !n.is_empty())
            }
            upcc_engine::StoreError::LayoutVersion { found, .. } => Some(format!(
                "it was written by a upcc of another store layout ({found}): use that upcc, or choose another --store"
            )),
            _ => None,
        };
        let err = Error::new(tier, e.to_string());
        match hint {
            Some(h) => err.hint(h),
            None => err,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The nearest of `candidates` to `word`, if it is close enough to be a plausible typo: the
/// fewest edits, a swap of two neighbours counting as one (`trian` is `train`, not `trials`),
/// then the most similar (Jaro-Winkler, which also decides what is close enough).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| {
            (
                strsim::damerau_levenshtein(word, c),
                strsim::jaro_winkler(word, c),
                c,
            )
        })
        .filter(|(_, score, _)| *score > 0.7)
        .min_by(|a, b| {
            a.0.cmp(&b.0)
                .then(b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal))
        })
        .map(|(_, _, c)| c)
}

#[cfg(test)]
mod nearest_tests {
    use super::nearest;

    #[test]
    fn a_swapped_pair_is_one_edit() {
        let fields = ["trials", "train", "targets", "params"];
        assert_eq!(nearest("trian", fields), Some("train"));
        assert_eq!(nearest("trails", fields), Some("trials"));
        assert_eq!(nearest("xyz", fields), None);
    }
}
