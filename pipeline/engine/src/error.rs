//! Engine errors, tiered: the tier decides the exit code.

use crate::canonical::CanonicalError;
use crate::lease::LeaseError;
use crate::store::StoreError;

/// Who has to act on an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Bad input from the user (spec, data files, parameters): exit 2.
    User,
    /// The environment (disk, permissions, locks, a failed computation): exit 1.
    Environment,
    /// A bug in upcc: exit 3.
    Internal,
}

impl Tier {
    /// The process exit code of an error of this tier: the one place it is decided.
    pub fn exit_code(self) -> i32 {
        match self {
            Tier::User => 2,
            Tier::Environment => 1,
            Tier::Internal => 3,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    #[error("cannot read `{path}` ({context}): {message}")]
    Source {
        context: String,
        path: String,
        message: String,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn tier(&self) -> Tier {
        match self {
            EngineError::Source { .. } => Tier::User,
            EngineError::Internal(_) | EngineError::Canonical(_) => Tier::Internal,
            _ => Tier::Environment,
        }
    }
}
