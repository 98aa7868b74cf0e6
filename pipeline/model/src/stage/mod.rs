//! The stages every method shares, one file each: its task (which is also its key's
//! parameters) and how it is wired into the DAG. Methods live in `method/`.

pub mod cluster;
pub mod constraints;
pub mod expert;
pub mod features;
pub mod fetch;
pub mod metrics;
pub mod pretrain;
pub mod select;
