//! Errors of the command line, with the tier that decides the exit code and `hint:` lines.

use std::fmt;

pub use upcc_engine::Tier;

/// An error to show the user: the message, its causes and hints.
#[derive(Debug)]
pub struct CliError {
    pub tier: Tier,
    pub message: String,
    pub causes: Vec<String>,
    pub hints: Vec<String>,
}

impl CliError {
    pub fn user(message: impl Into<String>) -> Self {
        CliError {
            tier: Tier::User,
            message: message.into(),
            causes: vec![],
            hints: vec![],
        }
    }
    pub fn env(message: impl Into<String>) -> Self {
        CliError {
            tier: Tier::Environment,
            message: message.into(),
            causes: vec![],
            hints: vec![],
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        CliError {
            tier: Tier::Internal,
            message: message.into(),
            causes: vec![],
            hints: vec![],
        }
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
        match self.tier {
            Tier::User => 2,
            Tier::Environment => 1,
            Tier::Internal => 3,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        for c in &self.causes {
            writeln!(f, "  Caused by: {c}")?;
        }
        for h in &self.hints {
            writeln!(f, "hint: {h}")?;
        }
        Ok(())
    }
}

impl From<upcc_engine::EngineError> for CliError {
    fn from(e: upcc_engine::EngineError) -> Self {
        CliError {
            tier: e.tier(),
            message: e.to_string(),
            causes: vec![],
            hints: vec![],
        }
    }
}

impl From<upcc_engine::StoreError> for CliError {
    fn from(e: upcc_engine::StoreError) -> Self {
        let tier = match e {
            upcc_engine::StoreError::NotAStore(_)
            | upcc_engine::StoreError::LayoutVersion { .. } => Tier::User,
            _ => Tier::Environment,
        };
        CliError {
            tier,
            message: e.to_string(),
            causes: vec![],
            hints: vec![],
        }
    }
}

pub type Result<T> = std::result::Result<T, CliError>;

/// The nearest of `candidates` to `word`, if it is close enough to be a plausible typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal))
        .map(|(_, c)| c)
}
