//! `upcc config`: the spec as resolved (Hydra's saved config): the file after `--set`, every
//! default filled in, each method's sections as it trains with them. Computes nothing.

use super::context::Env;
use crate::cli::ConfigArgs;
use upcc_model::error::{Error, Result};

pub fn config(args: &ConfigArgs, _env: &Env) -> Result<i32> {
    let spec = upcc_model::specs::load(&args.spec, &args.set)?;
    super::context::note_shadowed(&spec);
    let resolved = spec.resolved();
    let text = if args.json {
        serde_json::to_string_pretty(&resolved).map_err(|e| Error::internal(e.to_string()))? + "\n"
    } else {
        let mut head = format!("# upcc config {}", args.spec);
        for s in &args.set {
            head.push_str(&format!(" --set {s}"));
        }
        head.push_str("\n# resolved: defaults filled in; `methods.<name>` as each trains\n");
        head + &serde_yaml_ng::to_string(&resolved).map_err(|e| Error::internal(e.to_string()))?
    };
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(0)
}
