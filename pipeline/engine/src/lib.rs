//! upcc-engine: the content-addressed DAG engine of upcc.
//!
//! It knows DAGs, node keys, the store, leases and the local executor, and nothing of
//! clustering: stages are opaque [`Task`]s that turn verified input bytes into output bytes.
//! See `README.md` in this crate for what it owns and what it does not.

pub mod canonical;
pub mod dag;
pub mod digest;
pub mod error;
pub mod executor;
pub mod fsutil;
pub mod jobs;
pub mod key;
pub mod lease;
pub mod plan;
pub mod remote;
pub mod store;
pub mod task;
pub mod trust;

pub use dag::{Dag, DagBuilder, InputDef, NodeDef, NodeIndex, Source, SourceLocation};
pub use digest::{Artifact, Digest, NodeKeyTag};
pub use error::{EngineError, Tier};
pub use executor::{
    run, NodeReport, Observer, Outcome, ProvenanceBase, Quiet, RunConfig, RunEvent, RunReport,
};
pub use jobs::{JobBook, JobsLock};
pub use key::{KeyChange, KeyMaterial, KEY_SCHEMA_VERSION};
pub use lease::{LeaseHolder, LeaseTiming};
pub use plan::{plan, plan_with, NodeStatus, PlanEntry};
pub use remote::{
    Bucket, BucketError, DirBucket, Got, Listed, Listing, Put, PutMode, RemoteCache, RemoteStats,
    Uploaded,
};
pub use store::{Manifest, OutputRecord, Provenance, RefRecord, Store, StoreError};
pub use task::{PendingOutput, Resources, Task, TaskContext, TaskError};
pub use trust::{Distrust, Policy, PublicKey, SecretKey, SignatureRecord, Trust};

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests use std::fs freely
mod tests;
