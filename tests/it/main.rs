//! End-to-end tests of the `upcc` command line. One binary, one module per area; every
//! test gets a fresh temporary directory and store.

// Tests use std::fs freely: a failing call is a test failure at its own line.
#![allow(clippy::disallowed_methods)]

mod atomicity;
mod bad_input;
mod cache;
mod concurrency;
mod corruption;
mod determinism;
mod device;
mod eci;
mod explain;
mod fetch;
mod gc;
mod golden;
mod gpu_scripts;
mod hardening;
mod interop;
mod layers;
mod methods;
mod numerics;
mod params;
mod pickles;
mod published;
mod readme;
mod remote;
mod report;
mod results;
mod slurm;
mod snapshots;
mod soft_gpu;
mod specs;
mod targets;
mod trust;
mod util;
