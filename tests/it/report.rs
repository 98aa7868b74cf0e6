//! `upcc report`: every target written from the store, and a static HTML page that a real
//! browser renders (CI installs headless Chromium; `UPCC_TEST_BROWSER` names it).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::eci::eci_spec;
use crate::util::*;

fn report(env: &Env, args: &[&str]) -> Ran {
    let spec = env.spec();
    let out = env.path("report").display().to_string();
    let mut a = vec!["report", spec.as_str(), "--out", out.as_str()];
    a.extend_from_slice(args);
    env.upcc(&a)
}

#[test]
fn report_writes_every_target_and_an_html_page_from_the_store() {
    let env = Env::new();
    env.write("spec.yaml", &eci_spec());
    env.run_ok(&[]);
    let r = report(&env, &[]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("(3 targets, "), "{r:?}");
    let out = env.path("report");
    // Tables: the files equal what the table node stored.
    for (target, file, output) in [
        ("main", "table.md", "markdown"),
        ("main", "table.tex", "latex"),
        ("main", "table.csv", "csv"),
        ("experts", "table.md", "markdown"),
    ] {
        let written = std::fs::read(out.join(target).join(file)).unwrap();
        let stored = std::fs::read(output_path(&env, &format!("table/{target}"), output)).unwrap();
        assert_eq!(written, stored, "{target}/{file}");
    }
    assert!(out.join("main/table.parquet").exists());
    // The figure, as drawn.
    for (file, output) in [
        ("figure.png", "png"),
        ("figure.svg", "svg"),
        ("figure.parquet", "table"),
    ] {
        let written = std::fs::read(out.join("diag").join(file)).unwrap();
        assert_eq!(
            written,
            std::fs::read(output_path(&env, "figure/diag", output)).unwrap()
        );
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    for needle in [
        "<h2>eci</h2>",
        "<table>",
        "<th>eci-pp</th>",
        "<img src=\"diag/figure.svg\"",
        "href=\"main/table.tex\"",
        // Provenance: the cell's training node, its device and status.
        "<code>train/blobs/multi2/eci-pp/nopre/t1</code>",
        "cpu (cpu-f32-",
        "class=\"fresh\"",
    ] {
        assert!(html.contains(needle), "index.html lacks `{needle}`");
    }
    assert!(!html.contains("class=\"missing\""), "nothing is missing");
    // Training time per cell (Table 11's quantity): without pretraining, a ProbPair cell's is
    // its training node's recorded time (the simulated experts do not count), mean over trials.
    assert!(
        html.contains("Wall-clock training time per cell"),
        "index.html"
    );
    let csv = std::fs::read_to_string(out.join("main/training-time.csv")).unwrap();
    let line = csv
        .lines()
        .find(|l| l.contains("method=probpair") && l.contains("supervision=lv0.1"))
        .unwrap_or_else(|| panic!("{csv}"));
    let fields: Vec<&str> = line.rsplitn(4, ',').collect();
    let mean: f64 = fields[2].parse().unwrap();
    assert_eq!((fields[1], fields[0]), ("2", "2"), "{line}");
    let want: f64 = [1, 2]
        .iter()
        .map(|t| {
            let m = manifest(
                &env,
                &env.spec(),
                &format!("train/blobs/lv0.1/probpair/nopre/t{t}"),
                &[],
            );
            m["provenance"]["duration_s"].as_f64().unwrap()
        })
        .sum::<f64>()
        / 2.0;
    assert!((mean - want).abs() < 1e-3, "{mean} vs {want}");
}

#[test]
fn a_partial_store_reports_missing_cells_and_the_command_that_computes_them() {
    let env = Env::new();
    env.run_ok(&["method=probpair", "pretrain=false", "trial=1"]);
    let r = report(&env, &["target=main"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("1 of 8 cell trials computed"), "{r:?}");
    let html = std::fs::read_to_string(env.path("report/index.html")).unwrap();
    assert!(html.contains("7 cell trials missing, 0 stale"), "{html}");
    assert!(html.contains("target=main</code> computes them"), "{html}");
    assert!(html.contains("— / —"), "{html}");
    // The same store under other parameters: the computed cell is stale, not shown.
    let r = report(&env, &["--set", "train.epochs=4"]);
    assert_eq!(r.code, 0, "{r:?}");
    let html = std::fs::read_to_string(env.path("report/index.html")).unwrap();
    assert!(html.contains("7 cell trials missing, 1 stale"), "{html}");
    // Nothing computed under these parameters: no training time is left from the last report.
    assert!(!env.path("report/main/training-time.csv").exists());
}

#[test]
fn report_refuses_cell_selectors_unknown_targets_and_a_missing_store() {
    let env = Env::new();
    let r = report(&env, &[]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("no store at"), "{r:?}");
    env.run_ok(&["method=probpair", "pretrain=false", "trial=1"]);
    let r = report(&env, &["method=probpair"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("a report selects whole targets only"),
        "{r:?}"
    );
    let r = report(&env, &["target="]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("`target=` names no target"), "{r:?}");
    let r = report(&env, &["target=mian"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("no target `mian`") && r.stderr.contains("main"),
        "{r:?}"
    );
}

/// The browser: `UPCC_TEST_BROWSER` (CI sets it, and the test then fails without one), else
/// `chromium` on the PATH, else the test says it was skipped.
fn browser() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("UPCC_TEST_BROWSER") {
        let b = PathBuf::from(b);
        let found = Command::new(&b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(found, "UPCC_TEST_BROWSER={} does not run", b.display());
        return Some(b);
    }
    ["chromium", "chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

fn headless(browser: &Path, args: &[&str], page: &Path) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,1600",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run the browser")
}

#[test]
fn the_report_renders_in_a_real_browser() {
    let Some(browser) = browser() else {
        eprintln!("skipped: no headless Chromium (CI installs one and sets UPCC_TEST_BROWSER)");
        return;
    };
    let env = Env::new();
    env.write("spec.yaml", &eci_spec());
    env.run_ok(&[]);
    assert_eq!(report(&env, &[]).code, 0);
    let page = env.path("report/index.html");
    // The DOM after load: tables present, every image loaded, no console output.
    let dom = headless(&browser, &["--dump-dom"], &page);
    assert!(dom.status.success(), "{dom:?}");
    let text = String::from_utf8_lossy(&dom.stdout);
    assert!(
        text.contains("data-images-loaded=\"1/1\""),
        "images: {text}"
    );
    assert!(text.matches("<table>").count() >= 3, "{text}");
    let log = String::from_utf8_lossy(&dom.stderr);
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    // A screenshot that is not blank.
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let s = headless(
        &browser,
        &[&format!("--screenshot={}", shot.display())],
        &page,
    );
    assert!(s.status.success(), "{s:?}");
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let inked = pixels
        .chunks(px)
        .filter(|p| p.iter().take(3).any(|&c| c < 200))
        .count();
    let total = pixels.len() / px;
    assert!(
        inked * 50 > total,
        "the screenshot is (nearly) blank: {inked} of {total} pixels inked"
    );
    println!("report screenshot: {}", shot.display());
}

/// pdflatex, when CI installed it (`UPCC_TEST_LATEX`) or it is on the PATH.
fn pdflatex() -> Option<String> {
    let want = std::env::var("UPCC_TEST_LATEX").ok();
    let cmd = want
        .clone()
        .filter(|w| w != "1")
        .unwrap_or("pdflatex".into());
    let found = Command::new(&cmd)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || want.is_none(),
        "UPCC_TEST_LATEX is set but `{cmd}` does not run (CI installs Debian's texlive)"
    );
    found.then_some(cmd)
}

#[test]
fn every_generated_tex_compiles_with_stock_pdflatex() {
    let Some(pdflatex) = pdflatex() else {
        eprintln!("skipped: no pdflatex (CI installs texlive and sets UPCC_TEST_LATEX)");
        return;
    };
    let env = Env::new();
    // Titles with what stock pdflatex rejects raw (π, λ, ≥, —) or reads as markup (%, &, _).
    let spec = eci_spec()
        .replacen(
            "    title: eci\n",
            "    title: \"ECI-PP vs ProbPair — π = 0.3, λ ≥ 0, 100% & more_x\"\n",
            1,
        )
        .replacen(
            "  experts:\n",
            "  spots:\n    kind: blind-spots\n    grid: {dataset: [blobs], supervision: [multi2]}\n  experts:\n",
            1,
        );
    env.write("spec.yaml", &spec);
    env.run_ok(&[]);
    assert_eq!(report(&env, &[]).code, 0);
    let out = env.path("report");
    let mut texs = Vec::new();
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        let t = e.path().join("table.tex");
        if t.exists() {
            texs.push(t);
        }
    }
    texs.sort();
    assert!(texs.len() >= 3, "{texs:?}");
    for tex in &texs {
        let body = std::fs::read_to_string(tex).unwrap();
        assert!(body.is_ascii(), "{}: not ASCII:\n{body}", tex.display());
        let dir = tex.parent().unwrap();
        std::fs::write(
            dir.join("doc.tex"),
            "\\documentclass{article}\n\\usepackage{booktabs,xcolor}\n\\begin{document}\n\\input{table.tex}\n\\end{document}\n",
        )
        .unwrap();
        let o = Command::new(&pdflatex)
            .args(["-interaction=nonstopmode", "-halt-on-error", "doc.tex"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            o.status.success() && dir.join("doc.pdf").exists(),
            "{} does not compile:\n{body}\n{}",
            tex.display(),
            String::from_utf8_lossy(&o.stdout)
        );
    }
    let main = std::fs::read_to_string(out.join("main").join("table.tex")).unwrap();
    assert!(main.contains("$\\pi$ = 0.3, $\\lambda$ $\\ge$ 0"), "{main}");
    assert!(
        main.contains("$\\pm$"),
        "the spread over the 2 trials: {main}"
    );
    assert!(main.contains("mean$\\pm$std over 2 trials"), "{main}");
}
