//! The subcommands, one file each; `context` is what they share.

pub mod cancel;
pub mod config;
pub mod context;
pub mod device;
pub mod explain;
pub mod frame;
pub mod gc;
pub mod job;
pub mod key;
pub mod pull;
pub mod push;
pub mod report;
pub mod results;
pub mod run;
pub mod status;
pub mod verify;
pub mod worker;

pub use cancel::cancel;
pub use config::config;
pub use context::{store_path, Env, DEFAULT_NODE_THREADS};
pub use device::device;
pub use explain::explain;
pub use gc::gc;
pub use job::job;
pub use key::key;
pub use pull::pull;
pub use push::push;
pub use report::report;
pub use results::results;
pub use run::run;
pub use status::status;
pub use verify::verify;
pub use worker::worker;
