//! `upcc report`: every target of a spec written out from the store — tables as Markdown,
//! LaTeX, CSV and Parquet, figures as PNG, SVG and their Parquet table — with a static
//! `index.html` that shows them all, which cells are missing or stale, and where each result
//! came from (commit, host, device, wall time). Reads the store only; runs nothing.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use upcc_engine::{plan, InputDef, Manifest, NodeStatus, PlanEntry, Store};

use super::context::{self as commands, Env};
use crate::cli::ReportArgs;
use upcc_model::error::{Error, Result};
use upcc_model::graph::build;
use upcc_model::specs::{self, Spec};
use upcc_model::targets::runtime::{fresh_manifest, runtime_table, training_time, Durations};
use upcc_model::targets::table::render_target;
use upcc_model::targets::{TableInput, TargetKind, TargetNodes, View};

/// The files a report writes into a target's folder.
const REPORT_FILES: [&str; 9] = [
    "table.md",
    "table.tex",
    "table.csv",
    "table.parquet",
    "figure.png",
    "figure.svg",
    "figure.parquet",
    "training-time.csv",
    "trials.parquet",
];

/// One cell × trial of a target as the report lists it.
struct CellRow {
    label: String,
    trial: u64,
    status: NodeStatus,
    /// The node whose provenance is shown (the cell's training, when it has one).
    work_id: String,
    manifest: Option<Manifest>,
    /// Wall time of every training upstream of the cell trial (pretraining and searches
    /// included, the simulated experts not), when all of them are computed: the paper's
    /// Table 11 quantity.
    training_s: Option<f64>,
}

/// One target as written.
struct Written {
    name: String,
    kind: TargetKind,
    title: String,
    /// Markdown of the table (tables), or a line saying the figure is not drawn yet.
    markdown: String,
    /// Files written under `<out>/<name>/`, by label.
    files: Vec<(String, String)>,
    figure: Option<String>,
    cells: Vec<CellRow>,
    /// The command that computes its missing cells (the user's store and `--set`s kept).
    run_command: String,
}

pub fn report(args: &ReportArgs, env: &Env) -> Result<i32> {
    let (spec_arg, selectors) = args
        .spec_and_selectors
        .split_first()
        .expect("clap requires a spec");
    let spec = specs::load(spec_arg, &args.set)?;
    commands::note_shadowed(&spec);
    let wanted = targets_selected(selectors, &spec)?;
    let run_cmd = |selector: Option<&str>| {
        let mut words = vec![spec_arg.clone()];
        words.extend(selector.map(String::from));
        super::results::run_command(&env.store, &words, &args.set)
    };
    let compute = env.compute(false)?;
    let built = build(&spec, 1, compute, &super::context::host())?;
    let path = commands::store_path(&env.store);
    if !path.join("STORE.json").exists() {
        return Err(Error::user(format!(
            "no store at `{}`: nothing has been computed there yet",
            path.display()
        ))
        .hint(format!(
            "run the spec first (`{}`), or name the store with --store DIR",
            run_cmd(None)
        )));
    }
    let store = commands::open_store(&env.store, false)?;
    let entries = plan(&built.dag, &store, &spec.file.name)?;
    fs_err::create_dir_all(&args.out)
        .map_err(|e| Error::user(format!("cannot create `{}`: {e}", args.out.display())))?;
    let mut targets: Vec<&TargetNodes> = built
        .targets
        .iter()
        .filter(|t| wanted.as_ref().is_none_or(|w| w.contains(&t.name)))
        .collect();
    targets.sort_by_key(|t| {
        spec.target_order
            .iter()
            .position(|n| n == &t.name)
            .unwrap_or(usize::MAX)
    });
    let mut healed = false;
    let mut durations = Durations::new();
    let mut written = Vec::new();
    for t in targets {
        let mut w = write_target(
            t,
            &built.dag,
            &entries,
            &store,
            &args.out,
            &mut healed,
            &mut durations,
        )?;
        w.run_command = run_cmd(Some(&format!("target={}", t.name)));
        if t.kind.view() == View::Table && t.cells.iter().any(|c| c.output == "metrics") {
            // The long table: one row per cell trial and split, scores in float64.
            let rows = super::results::collect(
                &spec,
                &built,
                &|n, _| n == t.name,
                &store,
                None,
                Some(&entries),
            )?;
            let bytes = super::results::long_frame(&rows).to_parquet()?;
            write(&args.out.join(&t.name).join("trials.parquet"), &bytes)?;
            w.files.push((
                "trials.parquet".to_string(),
                format!("{}/trials.parquet", t.name),
            ));
        }
        written.push(w);
    }
    // The spec as resolved (Hydra's saved config): what every result on the page was
    // computed with.
    let config =
        serde_yaml_ng::to_string(&spec.resolved()).map_err(|e| Error::internal(e.to_string()))?;
    write(&args.out.join("config.yaml"), config.as_bytes())?;
    let html = index_html(&spec, &store, &written);
    let index = args.out.join("index.html");
    write(&index, html.as_bytes())?;
    let complete: usize = written
        .iter()
        .map(|w| {
            w.cells
                .iter()
                .filter(|c| c.status == NodeStatus::Fresh)
                .count()
        })
        .sum();
    let total: usize = written.iter().map(|w| w.cells.len()).sum();
    println!(
        "report: {} ({} targets, {complete} of {total} cell trials computed)",
        index.display(),
        written.len()
    );
    if healed {
        eprintln!(
            "upcc: warning: corrupt results were quarantined while reading; `{}` recomputes them and a new report shows them",
            run_cmd(None)
        );
    }
    Ok(0)
}

/// `target=NAME[,NAME…]` selectors (the report's only kind); `None`: every target.
fn targets_selected(selectors: &[String], spec: &Spec) -> Result<Option<BTreeSet<String>>> {
    let mut wanted = BTreeSet::new();
    for s in selectors {
        let Some(names) = s.strip_prefix("target=") else {
            return Err(
                Error::user(format!("`{s}`: a report selects whole targets only")).hint(
                    "use `target=NAME` (several: `target=a,b`), or no selector for every target",
                ),
            );
        };
        if names.split(',').all(str::is_empty) {
            return Err(Error::user(format!("`{s}` names no target"))
                .hint("`target=NAME`, or no selector for every target"));
        }
        for n in names.split(',').filter(|n| !n.is_empty()) {
            if !spec.file.targets.contains_key(n) {
                let known: Vec<&str> = spec.file.targets.keys().map(|k| k.as_str()).collect();
                return Err(Error::user(format!("`{s}`: the spec has no target `{n}`"))
                    .hint(format!("its targets: {}", known.join(", "))));
            }
            wanted.insert(n.to_string());
        }
    }
    Ok((!wanted.is_empty()).then_some(wanted))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    fs_err::write(path, bytes)
        .map_err(|e| Error::env(format!("cannot write `{}`: {e}", path.display())))
}

/// The node that did the cell's work: the leaf itself when it trains a network (its numerics
/// class is a device's, not `exact`), else its nearest upstream node that does (breadth first).
fn work_node(dag: &upcc_engine::Dag, leaf: usize) -> usize {
    let mut queue = std::collections::VecDeque::from([leaf]);
    let mut seen = BTreeSet::new();
    while let Some(i) = queue.pop_front() {
        if !seen.insert(i) {
            continue;
        }
        let n = dag.node(i);
        if n.numerics != "exact" {
            return i;
        }
        for (_, input) in &n.inputs {
            if let InputDef::Node { node, .. } = input {
                queue.push_back(node.0);
            }
        }
    }
    leaf
}

/// The summed wall time of the trainings upstream of `leaf` (nodes with a device numerics
/// class, except the simulated experts), or `None` if one of them is not computed.
fn training_seconds(
    dag: &upcc_engine::Dag,
    entries: &[PlanEntry],
    store: &Store,
    leaf: usize,
    durations: &mut Durations,
) -> Result<Option<f64>> {
    Ok(training_time(dag, entries, store, leaf, durations)?.map(|(s, _)| s))
}

/// Per cell (trials pooled): mean training wall time and the trials it is over.
fn training_times(cells: &[CellRow]) -> Vec<(String, f64, usize, usize)> {
    let mut by_cell: Vec<(String, Vec<f64>, usize)> = Vec::new();
    for c in cells {
        let i = match by_cell.iter().position(|(l, _, _)| *l == c.label) {
            Some(i) => i,
            None => {
                by_cell.push((c.label.clone(), vec![], 0));
                by_cell.len() - 1
            }
        };
        by_cell[i].2 += 1;
        if let Some(t) = c.training_s {
            by_cell[i].1.push(t);
        }
    }
    by_cell
        .into_iter()
        .filter(|(_, t, _)| !t.is_empty())
        .map(|(l, t, n)| (l, t.iter().sum::<f64>() / t.len() as f64, t.len(), n))
        .collect()
}

fn write_target(
    t: &TargetNodes,
    dag: &upcc_engine::Dag,
    entries: &[PlanEntry],
    store: &Store,
    out: &Path,
    healed: &mut bool,
    durations: &mut Durations,
) -> Result<Written> {
    let dir = out.join(&t.name);
    fs_err::create_dir_all(&dir)
        .map_err(|e| Error::env(format!("cannot create `{}`: {e}", dir.display())))?;
    // A previous report's files of this target go first, so that nothing stale (a figure no
    // longer drawn for these parameters) lingers beside the new ones. Only the report's own
    // file names are touched.
    for file in REPORT_FILES {
        let _ = fs_err::remove_file(dir.join(file));
    }
    let mut cells = Vec::new();
    let mut found: Vec<(&TableInput, Vec<u8>)> = Vec::new();
    for (cell, input) in t.cells.iter().zip(&t.inputs) {
        let e = &entries[cell.leaf];
        let work = work_node(dag, cell.leaf);
        cells.push(CellRow {
            label: cell
                .coords
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            trial: cell.trial,
            status: e.status,
            work_id: entries[work].id.clone(),
            manifest: fresh_manifest(store, &entries[work])?,
            training_s: training_seconds(dag, entries, store, cell.leaf, durations)?,
        });
        if t.kind.view() != View::Table {
            continue;
        }
        if let Some(m) = fresh_manifest(store, e)? {
            let key = e.key.expect("fresh nodes have keys");
            if let Some(bytes) =
                commands::view_object(store, &key, &m.outputs[cell.output].digest, healed)?
            {
                found.push((input, bytes));
            }
        }
    }
    let mut files = Vec::new();
    let mut figure = None;
    let markdown = if t.kind.view() == View::Figure {
        let e = &entries[t.node];
        let mut drawn = false;
        if let (Some(m), Some(key)) = (fresh_manifest(store, e)?, e.key) {
            let mut outputs = Vec::new();
            for (output, file) in [
                ("png", "figure.png"),
                ("svg", "figure.svg"),
                ("table", "figure.parquet"),
            ] {
                match commands::view_object(store, &key, &m.outputs[output].digest, healed)? {
                    Some(b) => outputs.push((file, b)),
                    None => break,
                }
            }
            if outputs.len() == 3 {
                for (file, bytes) in outputs {
                    write(&dir.join(file), &bytes)?;
                    files.push((file.to_string(), format!("{}/{file}", t.name)));
                }
                figure = Some(format!("{}/figure.svg", t.name));
                drawn = true;
            }
        }
        if drawn {
            String::new()
        } else {
            let done = cells
                .iter()
                .filter(|c| c.status == NodeStatus::Fresh)
                .count();
            format!(
                "The figure is not drawn yet: {done} of {} cell trials have their results.",
                cells.len()
            )
        }
    } else {
        let inputs: Vec<(&TableInput, &[u8])> =
            found.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        let r = if t.kind.view() == View::Runtime {
            runtime_table(t, dag, entries, store, durations)?
        } else {
            render_target(t.kind.table_source(), &t.layout, &inputs, t.trials)
                .map_err(|e| Error::env(e.to_string()))?
        };
        for (file, bytes) in [
            ("table.md", r.markdown.as_bytes()),
            ("table.tex", r.latex.as_bytes()),
            ("table.csv", r.csv.as_bytes()),
            ("table.parquet", r.parquet.as_slice()),
        ] {
            write(&dir.join(file), bytes)?;
            files.push((file.to_string(), format!("{}/{file}", t.name)));
        }
        r.markdown
    };
    let times = training_times(&cells);
    if !times.is_empty() {
        let mut csv = String::from("cell,mean_training_seconds,trials_timed,trials\n");
        for (label, mean, timed, n) in &times {
            csv.push_str(&format!("\"{label}\",{mean:.3},{timed},{n}\n"));
        }
        write(&dir.join("training-time.csv"), csv.as_bytes())?;
        files.push((
            "training-time.csv".to_string(),
            format!("{}/training-time.csv", t.name),
        ));
    }
    Ok(Written {
        name: t.name.clone(),
        kind: t.kind,
        title: t.layout.title.clone(),
        markdown,
        files,
        figure,
        cells,
        run_command: String::new(),
    })
}

/// Escape text for HTML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Markdown (the tables' own rendering) to HTML.
fn markdown_html(md: &str) -> String {
    use pulldown_cmark::{html, Options, Parser};
    let parser = Parser::new_ext(md, Options::ENABLE_TABLES);
    let mut out = String::new();
    html::push_html(&mut out, parser);
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:.5em 0;font-size:14px}th,td{border:1px solid #bbb;padding:3px 7px;text-align:left}\
th{background:#eee}section{margin-bottom:2.5em;border-top:2px solid #ccc;padding-top:.5em}\
img{max-width:100%;border:1px solid #ddd}.missing{color:#a40}.stale{color:#a60}.fresh{color:#270}\
.note{color:#555;font-size:14px}details{margin:.5em 0}code{background:#f4f4f4;padding:0 3px}\
.broken{color:#b00;font-weight:bold}";

/// After load, each image that did not load is flagged in the page, and the body records how
/// many loaded (`data-images-loaded="k/n"`), so a moved or partial report says what it lacks.
const SCRIPT: &str = "window.addEventListener('load',function(){var im=document.images,ok=0;\
for(var i=0;i<im.length;i++){if(im[i].complete&&im[i].naturalWidth>0){ok++;}else{\
var p=document.createElement('p');p.className='broken';p.textContent='image missing: '+im[i].getAttribute('src');\
im[i].parentNode.insertBefore(p,im[i]);}}document.body.setAttribute('data-images-loaded',ok+'/'+im.length);});";

fn status_class(s: NodeStatus) -> &'static str {
    match s {
        NodeStatus::Fresh => "fresh",
        NodeStatus::Stale => "stale",
        NodeStatus::Missing => "missing",
    }
}

fn index_html(spec: &Spec, store: &Store, written: &[Written]) -> String {
    let mut h = String::new();
    let title = format!("upcc report: {}", spec.file.name);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    if !spec.file.description.is_empty() {
        let _ = writeln!(h, "<p>{}</p>", esc(&spec.file.description));
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">Spec <code>{}</code>, store <code>{}</code>. Tables and figures show what the store holds for the spec's current parameters; a cell not computed yet (or computed under other parameters) shows as —.</p>",
        esc(&spec.display),
        esc(&store.root().display().to_string())
    );
    if !spec.overrides.is_empty() {
        let sets: Vec<String> = spec
            .overrides
            .iter()
            .map(|o| format!("--set {}", o.arg))
            .collect();
        let _ = writeln!(
            h,
            "<p class=\"note\">With overrides: <code>{}</code>.</p>",
            esc(&sets.join(" "))
        );
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">The spec as resolved (every default filled in, each method's settings as it trains): <a href=\"config.yaml\">config.yaml</a>.</p>"
    );
    h.push_str("<ul>\n");
    for w in written {
        let fresh = w
            .cells
            .iter()
            .filter(|c| c.status == NodeStatus::Fresh)
            .count();
        let _ = writeln!(
            h,
            "<li><a href=\"#{}\">{}</a> — {fresh} of {} cell trials computed</li>",
            esc(&w.name),
            esc(&w.title),
            w.cells.len()
        );
    }
    h.push_str("</ul>\n");
    for w in written {
        let _ = writeln!(
            h,
            "<section id=\"{}\">\n<h2>{}</h2>\n<p class=\"note\">target <code>{}</code> ({})</p>",
            esc(&w.name),
            esc(&w.title),
            esc(&w.name),
            w.kind.name()
        );
        if let Some(f) = &w.figure {
            let _ = writeln!(
                h,
                "<p><img src=\"{}\" alt=\"{}\"></p>",
                esc(f),
                esc(&w.title)
            );
        }
        if !w.markdown.is_empty() {
            // The section heading already names the table.
            let body = match w.markdown.strip_prefix("### ") {
                Some(rest) => rest.split_once('\n').map_or("", |(_, b)| b),
                None => &w.markdown,
            };
            h.push_str(&markdown_html(body));
        }
        if !w.files.is_empty() {
            let links: Vec<String> = w
                .files
                .iter()
                .map(|(label, href)| format!("<a href=\"{}\">{}</a>", esc(href), esc(label)))
                .collect();
            let _ = writeln!(h, "<p class=\"note\">files: {}</p>", links.join(", "));
        }
        let count = |s: NodeStatus| w.cells.iter().filter(|c| c.status == s).count();
        let (stale, missing) = (count(NodeStatus::Stale), count(NodeStatus::Missing));
        if stale + missing > 0 {
            let _ = writeln!(
                h,
                "<p class=\"missing\">{missing} cell trials missing, {stale} stale (computed under other parameters): <code>{}</code> computes them.</p>",
                esc(&w.run_command)
            );
        }
        let times = training_times(&w.cells);
        if !times.is_empty() {
            let _ = writeln!(
                h,
                "<details><summary>Wall-clock training time per cell (the paper's Table 11 quantity: every training upstream of the cell, pretraining and searches included, the simulated experts not; mean over the timed trials)</summary>\n<table><tr><th>cell</th><th>training time</th><th>trials timed</th></tr>"
            );
            for (label, mean, timed, n) in &times {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{timed} of {n}</td></tr>",
                    esc(label),
                    upcc_report::text::hms(*mean)
                );
            }
            h.push_str("</table></details>\n");
        }
        let _ = writeln!(
            h,
            "<details><summary>Provenance of the {} cell trials</summary>\n<table><tr><th>cell</th><th>trial</th><th>status</th><th>node</th><th>commit</th><th>host</th><th>device</th><th>wall time</th><th>finished</th></tr>",
            w.cells.len()
        );
        for c in &w.cells {
            let (commit, host, device, wall, finished) = match &c.manifest {
                Some(m) => {
                    let p = &m.provenance;
                    (
                        p.git_revision
                            .as_deref()
                            .map(|r| r.chars().take(10).collect())
                            .unwrap_or_else(|| "—".to_string()),
                        p.host.clone(),
                        format!(
                            "{} ({})",
                            p.libraries.get("device").map_or("?", |s| s.as_str()),
                            m.material.numerics
                        ),
                        format!("{:.1} s", p.duration_s),
                        p.finished_at.clone(),
                    )
                }
                None => Default::default(),
            };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&c.label),
                c.trial,
                status_class(c.status),
                status_class(c.status),
                esc(&c.work_id),
                esc(&commit),
                esc(&host),
                esc(&device),
                esc(&wall),
                esc(&finished)
            );
        }
        h.push_str("</table></details>\n</section>\n");
    }
    let _ = write!(h, "<script>{SCRIPT}</script>\n</body></html>\n");
    h
}
