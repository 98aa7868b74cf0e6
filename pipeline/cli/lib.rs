//! The `upcc` command line: experiment specs, selectors, and the wiring of the stages into
//! engine tasks. This is the only crate that sees both the engine (`pipeline/engine`) and
//! the science (`stages/`).

pub mod cli;
pub mod commands;
pub mod device;
pub mod error;
pub mod eta;
pub mod graph;
pub mod method;
pub mod progress;
pub mod report;
pub mod select;
pub mod slurm;
pub mod spec;
pub mod stage;
pub mod wiring;

use clap::Parser;

/// Run the command line; returns the process exit code.
pub fn main_entry() -> i32 {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    init_tracing(cli.verbose);
    let env = commands::Env {
        store: cli.store.clone(),
        device: cli.device.clone(),
        gpus: cli.gpus.clone(),
        verbose: cli.verbose,
    };
    let result = match &cli.command {
        cli::Command::Run(a) => commands::run(a, &env),
        cli::Command::Status(a) => commands::status(a, &env),
        cli::Command::Explain(a) => commands::explain(a, &env),
        cli::Command::Verify => commands::verify(&env.store),
        cli::Command::Gc(a) => commands::gc(a, &env),
        cli::Command::Report(a) => report::report(a, &env),
        cli::Command::Cancel(a) => commands::cancel(a, &env),
        cli::Command::Job(a) => commands::job(a, &env),
        cli::Command::Device(a) => commands::device(a, &env),
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
