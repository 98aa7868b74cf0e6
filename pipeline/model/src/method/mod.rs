//! The compared methods, one file each: what sections of parameters a method reads, how its
//! settings are resolved and checked, and which nodes one cell of it needs. Adding a method is
//! one science file in `stages/core` and one file here, registered in [`REGISTRY`].

use std::any::Any;
use std::sync::Arc;

use upcc_engine::{TaskContext, TaskError};
use upcc_stages::{constraints, features};

use crate::error::Result;
use crate::specs::resolver::Resolver;
use crate::wiring::{Cell, Wiring};

pub mod cidec;
pub mod dcc;
pub mod eci_pp;
pub mod ensemble;
pub mod probpair;
pub mod spherepair;

/// A method's resolved settings (each method knows its own type).
pub type Settings = Arc<dyn Any + Send + Sync>;

/// The nodes of one cell of a method.
pub struct CellNodes {
    /// The training node (ECI-PP's carries the held-out diagnostics figures read).
    pub train: usize,
    /// The node whose `assignments` output the metrics read.
    pub assignments: usize,
}

/// A compared method.
pub trait Method: Sync + Send {
    /// The name a spec gives as `kind:` (or as the method's name).
    fn kind(&self) -> &'static str;
    /// What it is, in one line (listings and messages).
    fn summary(&self) -> &'static str;
    /// The parameter sections (`params.<section>`) it reads; a method entry of a spec may
    /// override exactly these.
    fn sections(&self) -> &'static [&'static str];
    /// Whether cells may pretrain (`pretrain: true`); false for methods without an
    /// autoencoder.
    fn pretrainable(&self) -> bool {
        true
    }
    /// Whether it records ECI-PP's held-out diagnostics (what `figure` targets draw).
    fn records_diagnostics(&self) -> bool {
        false
    }
    /// Whether these settings select a hyperparameter on the datasets' validation rows.
    fn needs_validation(&self, _settings: &Settings) -> bool {
        false
    }
    /// Whether it needs a multi-expert supervision setting (one member per expert).
    fn needs_multi_expert(&self) -> bool {
        false
    }
    /// Resolve and check its settings from the merged sections; problems go to `cx`.
    fn resolve(&self, cx: &mut Resolver) -> Option<Settings>;
    /// The selection node of a cell's hyperparameter search (its `table` output lists every
    /// candidate's mean validation ACC and the chosen value), if these settings search one.
    /// The search runs train on the dataset without its validation rows.
    fn selection(
        &self,
        _w: &mut Wiring,
        _cell: &Cell,
        _settings: &Settings,
    ) -> Result<Option<usize>> {
        Ok(None)
    }
    /// Add the nodes of one cell (on the dataset's `features` node) to the DAG.
    fn wire(
        &self,
        w: &mut Wiring,
        cell: &Cell,
        settings: &Settings,
        feat: usize,
    ) -> Result<CellNodes>;
}

/// Every method upcc implements.
pub static REGISTRY: &[&dyn Method] = &[
    &dcc::VanillaDcc,
    &dcc::VolMaxDcc,
    &cidec::Cidec,
    &spherepair::SpherePair,
    &probpair::PROBPAIR,
    &probpair::WEIGHTED_PROBPAIR,
    &eci_pp::EciPp,
    &ensemble::SP_EA,
    &ensemble::WPP_EA,
];

/// The method of a `kind` name.
pub fn lookup(kind: &str) -> Option<&'static dyn Method> {
    REGISTRY.iter().copied().find(|m| m.kind() == kind)
}

/// Every `kind` name.
pub fn kinds() -> Vec<&'static str> {
    REGISTRY.iter().map(|m| m.kind()).collect()
}

/// Every parameter section some method reads.
pub fn method_sections() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = REGISTRY
        .iter()
        .flat_map(|m| m.sections().iter().copied())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Features, training constraints and (with pretraining) the SDAE weights of a training node.
pub fn training_inputs(
    ctx: &TaskContext,
    pretrained: bool,
) -> std::result::Result<
    (
        features::Features,
        constraints::Constraints,
        Option<Vec<u8>>,
    ),
    TaskError,
> {
    let f = crate::stage::features::load(ctx)?;
    let c = crate::stage::constraints::load(ctx, "constraints")?;
    let weights = if pretrained {
        Some(ctx.input("weights")?.to_vec())
    } else {
        None
    };
    Ok((f, c, weights))
}

/// The settings of type `T` a method resolved (each method downcasts its own).
pub fn settings<T: 'static>(s: &Settings) -> &T {
    s.downcast_ref::<T>()
        .expect("a method is wired with the settings it resolved")
}

/// A method as the spec resolves it: the implementation and its checked settings.
#[derive(Clone)]
pub struct ResolvedMethod {
    pub method: &'static dyn Method,
    pub settings: Settings,
    /// Its sections as resolved (`params.<section>` merged with its own values), in JSON.
    pub sections: std::collections::BTreeMap<String, serde_json::Value>,
    /// What its own entry sets (`methods.<name>.<section>`), in JSON: the values that win
    /// over `params` and over `--set params…`.
    pub own: std::collections::BTreeMap<String, serde_json::Value>,
}
