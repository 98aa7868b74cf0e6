//! Experiment specs: YAML files naming datasets, supervision settings, methods, trials,
//! stage parameters and targets (each a grid of cells).
//!
//! Loading validates everything up front, before anything runs: the file's structure, every
//! name, and every parameter through its settings type's `check` (each method resolves and
//! checks its own sections). Every problem is reported at once, each at the file and line that
//! holds the value, or at the `--set` argument that gave it. `--set key=value` overrides any
//! parameter (dotted path; the parameter sections may omit `params.`).
//!
//! Files: `schema` (what the YAML deserialises into), `source` (reading, and placing
//! problems), `overrides` (`--set`), `sections` (the parameter sections), `resolver` (each
//! method's sections), `load` and `validate` (load and check: names are resolved there,
//! `kind:` among them), `spec` (the loaded spec). This file only names them.

pub mod axis;
pub mod embedded;
pub mod executor;
mod load;
mod overrides;
pub mod resolver;
pub mod schema;
pub mod sections;
pub mod source;
mod spec;
mod validate;

pub use crate::method::ResolvedMethod;
pub use axis::Axis;
pub use embedded::{embedded, MNIST5K, SMOKE_YAML};
pub use load::load;
pub use schema::*;
pub use sections::sections;
pub use source::Problems;
pub use source::{locate_path, read_source, SpecSource};
pub use spec::Spec;

#[cfg(test)]
mod tests {
    use super::load::*;
    use super::overrides::*;
    use super::sections::sections;
    use super::source::*;
    use serde_yaml_ng::Value;

    /// A misspelt parameter section is named with the section meant; top-level fields a spec
    /// file leaves out (`executor`) are not mistaken for one; the list of top-level fields is
    /// serde's.
    #[test]
    fn a_misspelt_section_in_set_names_the_section_meant() {
        let mut root: Value = serde_yaml_ng::from_str("name: x\n").unwrap();
        let secs = ["train", "pretrain", "cluster", "expert"];
        let e = apply_overrides(&mut root, &["trian.epochs=3".into()], &secs).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("no section `trian`") && text.contains("`train.epochs`"),
            "{text}"
        );
        let ok = apply_overrides(&mut root, &["executor.slurm.partition=gpu".into()], &secs);
        assert!(ok.is_ok(), "{ok:?}");
        let serde_says = serde_yaml_ng::from_str::<super::SpecFile>("nope: 1")
            .unwrap_err()
            .to_string();
        for f in SPEC_FIELDS {
            assert!(serde_says.contains(&format!("`{f}`")), "{f}: {serde_says}");
        }
    }

    #[test]
    fn explains_unknown_fields_with_the_nearest_name() {
        let (m, h) = explain_serde("params.constraints: unknown field `corruptoin`, expected one of `budget`, `corruption`, `diagnostic_pairs` at line 3 column 5");
        assert_eq!(m, "params.constraints: unknown field `corruptoin`, expected one of `budget`, `corruption`, `diagnostic_pairs`");
        assert_eq!(h.as_deref(), Some("did you mean `corruption`?"));
        let (_, h) = explain_serde("unknown field `qqq`, expected `aa` or `bb`");
        assert_eq!(h.as_deref(), Some("valid: `aa`, `bb`"));
        let (m, _) = explain_serde(
            "params.train.epochs: invalid type: integer `99999999999999999999999` as u128, expected any YAML value",
        );
        assert!(m.contains("far too large") && !m.contains("u128"), "{m}");
        let (m, _) = explain_serde("invalid type: string \"two\", expected usize");
        assert!(m.ends_with("expected a whole number ≥ 0"), "{m}");
    }

    #[test]
    fn locate_finds_whole_words_only() {
        let text = "a: probpair\nb: [probpar, x]\n";
        assert_eq!(locate(text, "probpar"), Some(2));
        assert_eq!(locate(text, "probpair"), Some(1));
    }

    #[test]
    fn locate_path_follows_indentation_and_flow_mappings() {
        let text = "\
name: x
params:
  train:
    epochs: 3
    lr: 0.1
  constraints: {budget: 300, corruption: 0.3}
methods:
  eci-pp: {train: {epochs: 8}, eci: {warmup_epochs: 2}}
  probpair:
    train:
      epochs: 4
";
        assert_eq!(locate_path(text, &["params", "train", "lr"]), Some(5));
        assert_eq!(locate_path(text, &["params", "train", "epochs"]), Some(4));
        assert_eq!(
            locate_path(text, &["params", "constraints", "corruption"]),
            Some(6)
        );
        assert_eq!(
            locate_path(text, &["methods", "eci-pp", "eci", "warmup_epochs"]),
            Some(8)
        );
        assert_eq!(
            locate_path(text, &["methods", "probpair", "train", "epochs"]),
            Some(11)
        );
        // A missing leaf places the problem at the deepest key present.
        assert_eq!(
            locate_path(text, &["params", "train", "batch_size"]),
            Some(3)
        );
    }

    #[test]
    fn overrides_create_and_replace_nested_keys() {
        let mut v: Value =
            serde_yaml_ng::from_str("params:\n  constraints:\n    corruption: 0.3\n").unwrap();
        let placed = apply_overrides(
            &mut v,
            &["constraints.corruption=0.5".into(), "train.epochs=3".into()],
            &sections(),
        )
        .unwrap();
        assert_eq!(v["params"]["constraints"]["corruption"].as_f64(), Some(0.5));
        assert_eq!(v["params"]["train"]["epochs"].as_u64(), Some(3));
        assert_eq!(placed[0].0, ["params", "constraints", "corruption"]);
        assert!(apply_overrides(&mut v, &["nonsense".into()], &sections()).is_err());
        let mut w: Value =
            serde_yaml_ng::from_str("supervision:\n  lv0.01: {kind: single, level: 0.01}\n")
                .unwrap();
        let placed = apply_overrides(
            &mut w,
            &["supervision.lv0.01.level=0.1".into()],
            &sections(),
        )
        .unwrap();
        assert_eq!(w["supervision"]["lv0.01"]["level"].as_f64(), Some(0.1));
        assert_eq!(placed[0].0, ["supervision", "lv0.01", "level"]);
    }

    #[test]
    fn embedded_smoke_spec_loads() {
        let s = load("smoke", &[]).unwrap();
        assert_eq!(s.file.name, "smoke");
        assert!(!s.trials.is_empty());
        assert_eq!(
            s.target_order,
            [
                "main",
                "eci",
                "experts",
                "diagnostics",
                "sweep",
                "blind-spots",
                "constraint-values",
                "runtime"
            ]
        );
    }
}
