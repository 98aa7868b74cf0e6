//! The `upcc` command line: arguments, verbs, progress and the environment, over the
//! experiment model (`pipeline/model`, crate `upcc-model`), and two executor adapters: Slurm
//! (`slurm`) and the remote cache's bucket (`remote`).

pub mod cli;
pub mod commands;
pub mod env;
pub mod eta;
pub mod progress;
pub mod remote;
pub mod slurm;
pub mod trust;

use clap::Parser;

/// Run the command line; returns the process exit code.
pub fn main_entry() -> i32 {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            if let Some((message, hint)) = explain_clap_error(&e) {
                let err = upcc_model::Error::user(message).hint(hint);
                eprint!("{err}");
                return err.exit_code();
            }
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    init_tracing(cli.verbose);
    say_what_ctrl_c_keeps();
    if let Err(e) = env::check() {
        eprint!("{e}");
        return e.exit_code();
    }
    if let Some(kb) = env::test_k_block() {
        upcc_nn::cpu::set_k_block(kb);
    }
    if let Some(files) = env::test_code_edits() {
        upcc_model::code::set_test_edits(files);
    }
    commands::context::set_keep_code_changes(cli.keep_code_changes);
    if cli.keep_code_changes {
        // The Slurm jobs a run submits inherit this process's environment (sbatch's default
        // `--export=ALL`): they keep the same results. Set before any thread starts.
        std::env::set_var("UPCC_KEEP_CODE_CHANGES", "1");
    }
    let env = commands::Env {
        store: cli.store.clone(),
        device: cli.device.clone(),
        gpus: cli.gpus.clone(),
        numerics: cli.numerics.clone(),
        verbose: cli.verbose,
        announce_device: matches!(
            cli.command,
            cli::Command::Run(_)
                | cli::Command::Job(_)
                | cli::Command::Worker(_)
                | cli::Command::Device(_)
        ),
    };
    let result = match &cli.command {
        cli::Command::Run(a) => commands::run(a, &env),
        cli::Command::Status(a) => commands::status(a, &env),
        cli::Command::Explain(a) => commands::explain(a, &env),
        cli::Command::Results(a) => commands::results(a, &env),
        cli::Command::Config(a) => commands::config(a, &env),
        cli::Command::Verify => commands::verify(&env.store),
        cli::Command::Gc(a) => commands::gc(a, &env),
        cli::Command::Report(a) => commands::report(a, &env),
        cli::Command::Cancel(a) => commands::cancel(a, &env),
        cli::Command::Push(a) => commands::push(a, &env),
        cli::Command::Pull(a) => commands::pull(a, &env),
        cli::Command::Job(a) => commands::job(a, &env),
        cli::Command::Worker(a) => commands::worker(a, &env),
        cli::Command::Device(a) => commands::device(a, &env),
        cli::Command::Key(a) => commands::key(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprint!("{e}");
            // With --json, the error is also one JSON object on stdout (located problems,
            // causes, hints), so tools need not parse stderr.
            if cli.command.json() {
                println!("{}", e.to_json());
            }
            e.exit_code()
        }
    }
}

/// Clap's errors that do not say what to fix: an argument that is not UTF-8 (which one), and a
/// bad value that came from an environment variable (which variable).
fn explain_clap_error(e: &clap::Error) -> Option<(String, String)> {
    use clap::error::ErrorKind;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match e.kind() {
        ErrorKind::InvalidUtf8 => {
            let (i, bad) = args
                .iter()
                .enumerate()
                .find(|(_, a)| a.to_str().is_none())?;
            Some((
                format!(
                    "argument {} (`{}`) is not valid UTF-8",
                    i + 1,
                    bad.to_string_lossy()
                ),
                "spec files, selectors and --set values must be UTF-8 text: rename the file or reach it through a symlink with a UTF-8 name (only --store takes any path)".into(),
            ))
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let text = e.to_string();
            let given = |flag: &str| {
                args.iter().any(|a| {
                    a.to_str()
                        .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
                })
            };
            let (var, flag) = env::FLAG_VARS.iter().find(|(var, flag)| {
                std::env::var_os(var).is_some()
                    && !given(flag)
                    && text.contains(&format!("'{flag}"))
            })?;
            let value = std::env::var_os(var)?.to_string_lossy().into_owned();
            let why = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ")
                .to_string();
            Some((
                format!("environment variable {var}=`{value}` gives {flag} a value it does not take ({why})"),
                format!("fix it or unset it (`unset {var}`); `upcc {} --help` lists the valid values", first_word(&args)),
            ))
        }
        _ => None,
    }
}

/// The subcommand word of the arguments, for hints.
fn first_word(args: &[std::ffi::OsString]) -> String {
    args.iter()
        .filter_map(|a| a.to_str())
        .find(|a| {
            [
                "run", "status", "explain", "verify", "gc", "report", "cancel", "job", "device",
                "push", "pull",
            ]
            .contains(a)
        })
        .unwrap_or("run")
        .to_string()
}

/// Ctrl-C (SIGINT): one line saying what happens to the work, then exit 130 at once, as the
/// default action would. Nothing needs unwinding: outputs are published before their manifest
/// (atomically), and a node's lease is a lock the kernel drops with the process, so what was
/// stored is kept, nothing half-written is served, and what was running is free for the next
/// run to compute (or for another process now).
fn say_what_ctrl_c_keeps() {
    extern "C" fn on_sigint(_: libc::c_int) {
        const LINE: &[u8] = b"\nupcc: interrupted (Ctrl-C): results already stored are kept; nodes that were running are computed again by the next `upcc run`; uploads not finished go up with `upcc push`\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe; LINE is a static buffer.
        unsafe {
            libc::write(2, LINE.as_ptr().cast(), LINE.len());
            libc::_exit(130);
        }
    }
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(
            std::env::var_os("NO_COLOR").is_none()
                && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )
        .try_init();
}
