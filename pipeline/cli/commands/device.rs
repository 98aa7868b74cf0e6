//! `upcc device`: the device a run would train on, opened as a run opens it.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use serde_json::json;

use super::context::*;
use upcc_model::error::Result;

/// `upcc device`: the device a run would train on, opened as a run opens it.
pub fn device(args: &crate::cli::DeviceArgs, env: &Env) -> Result<i32> {
    let compute = env.device(args.json)?;
    let t0 = Instant::now();
    compute.open()?;
    let opened_s = t0.elapsed().as_secs_f64();
    let info = compute.info();
    if args.json {
        let facts: BTreeMap<_, _> = info.facts.iter().cloned().collect();
        println!(
            "{}",
            json!({"device": compute.name(), "numerics": compute.numerics(), "numerics_parts": upcc_model::device::describe_numerics(&compute.numerics()), "facts": facts, "open_seconds": opened_s})
        );
    } else {
        let mut rows = vec![
            ("device".to_string(), compute.name()),
            (
                "numerics".to_string(),
                format!("{} (part of every training node's key)", compute.numerics()),
            ),
        ];
        rows.extend(
            upcc_model::device::describe_numerics(&compute.numerics())
                .into_iter()
                .map(|p| ("  part".to_string(), p)),
        );
        rows.extend(info.facts.iter().cloned());
        if compute.is_gpu() {
            rows.push((
                "ready".into(),
                format!("kernels compiled and loaded in {opened_s:.2} s"),
            ));
        }
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = std::io::stdout().lock();
        for (k, v) in rows {
            let _ = writeln!(out, "{k:<w$}  {v}");
        }
    }
    Ok(0)
}
