//! The experiment model: an experiment spec, read and checked, turned into one DAG of engine
//! tasks. The command line (`pipeline/cli`) reads arguments and the environment and hands them
//! in; the engine (`pipeline/engine`) plans and runs the DAG; the stages (`stages/*`) compute.
//!
//! Bottom to top: `error`; `device` (the training device and its numerics class); `specs`
//! (schema, sources, overrides, the resolver, validation); `wiring` (adding nodes, a cell of a
//! grid); `stage`, `method`, `targets` (what the nodes compute and render); `graph` (spec →
//! DAG); `selectors` (which nodes a command acts on). The README's "Layers" table and
//! `tests/it/layers.rs` keep it so.

pub mod code;
pub mod device;
pub mod error;
pub mod graph;
pub mod method;
pub mod selectors;
pub mod specs;
pub mod stage;
pub mod targets;
pub mod wiring;

pub use error::{Error, Result};
