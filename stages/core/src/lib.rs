//! upcc-stages: the science of upcc.
//!
//! One module per stage (`features`, `expert`, `constraints`, `pretrain`, `train`, `cluster`,
//! `metrics`), each a pure function from decoded inputs to outputs with its own `VERSION`
//! and parameter struct. Stages never touch the store or the executor; `table` is the
//! Parquet codec they share. The `report` crate renders tables of results.

pub mod check;
pub mod cidec;
pub mod cluster;
pub mod constraints;
pub mod dcc;
pub mod eci;
pub mod ensemble;
pub mod error;
pub mod expert;
pub mod features;
pub mod metrics;
pub mod nets;
pub mod pretrain;
pub mod spherepair;
pub mod table;
pub mod train;

pub use check::{Check, Problem};
pub use error::{Monitor, Silent, StageError};
