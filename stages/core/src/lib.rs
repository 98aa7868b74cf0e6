//! upcc-stages: the science of upcc.
//!
//! The stages (`features`, `expert`, `constraints`, `pretrain`, `train`, `cluster`,
//! `metrics`) are each a pure function from decoded inputs to outputs with its own `VERSION`
//! and parameter struct. `train` runs ProbPair and Weighted ProbPair and hands the other
//! methods to their modules: `eci` (ECI-PP), `dcc` (VanillaDCC and VolMaxDCC),
//! `cidec`, `spherepair` and `ensemble` (SP-EA, WPP-EA); `nets` holds the networks
//! they share. `check` validates every parameter struct, `error` is the stages' error type,
//! and `table` is the Parquet codec they share. Stages never touch the store or the
//! executor. The `report` crate renders tables of results.

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
