//! Command-line arguments (raw), parsed by clap and then validated into settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "upcc",
    version,
    about = "Reproducible, content-addressed pipeline for the ECI-PP paper's experiments"
)]
pub struct Cli {
    /// Artifact store (default: $UPCC_STORE, else `artifacts/`).
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// More logging (-v: node logs, -vv: debug, including key material).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Device that trains networks: auto (a GPU when one is usable, else the CPU), cpu, cuda or
    /// cuda:N (default: $UPCC_DEVICE, else auto). It names the numerics class of training
    /// nodes, so CPU and GPU results never answer for each other.
    #[arg(long, global = true, value_name = "auto|cpu|cuda[:N]")]
    pub device: Option<String>,
    /// GPUs to spread training nodes over, e.g. `0,1` or `all` (numbers after
    /// CUDA_VISIBLE_DEVICES; implies the CUDA device; $UPCC_GPUS).
    #[arg(long, global = true, value_name = "LIST", env = "UPCC_GPUS")]
    pub gpus: Option<String>,
    /// Plan training nodes for numerics class CLASS instead of this machine's device (e.g.
    /// `cpu-f32-avx512`, or a GPU's class on a login node that has none; `upcc device` prints
    /// a machine's class): `status`, `explain` and `report` show the results of that class, and
    /// `run` refuses to compute where the device computes another ($UPCC_NUMERICS).
    #[arg(long, global = true, value_name = "CLASS", env = "UPCC_NUMERICS")]
    pub numerics: Option<String>,
    /// Keep results whose stage's code changed since they were computed, instead of
    /// recomputing them (the default; `status` marks them `code changed: FILE`)
    /// ($UPCC_KEEP_CODE_CHANGES).
    #[arg(long, global = true, env = "UPCC_KEEP_CODE_CHANGES")]
    pub keep_code_changes: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the stale nodes of a spec's targets (or of a selected cell or slice).
    Run(RunArgs),
    /// Show, without running anything, which nodes are fresh, stale (and why) or missing.
    Status(SpecArgs),
    /// Explain one node: its key material, inputs, manifest, provenance and why it is stale.
    Explain(ExplainArgs),
    /// Every cell × trial's scores in the store as data: coordinates, seed, overrides,
    /// ACC/NMI/ARI per split, training time and node keys (`--compare A B`: two runs side by
    /// side with deltas). Computes nothing.
    Results(ResultsArgs),
    /// Print the resolved spec: the file after `--set`, every default filled in, and each
    /// method's sections as it trains with them.
    Config(ConfigArgs),
    /// Re-hash every stored object; quarantine corrupt ones and the results that used them.
    Verify,
    /// Delete what the targets of the named specs do not reach.
    Gc(GcArgs),
    /// Write every target (tables, figures) and a static HTML report from the store.
    Report(ReportArgs),
    /// Cancel the Slurm jobs of a spec's stale nodes (or of a selected cell or slice).
    Cancel(SpecArgs),
    /// Upload the selected nodes' results in this store to the remote cache (those it lacks).
    Push(SpecArgs),
    /// Download from the remote cache the selected nodes' results this store lacks (computes
    /// nothing).
    Pull(SpecArgs),
    /// Run exactly one node whose inputs are computed: what a Slurm job of `run --executor
    /// slurm` runs. Fails if the spec no longer gives the node the submitted key.
    Job(JobArgs),
    /// Compute every node of one kind that can run, round after round, until none is left:
    /// what a worker job of `run --executor slurm` runs (workers mode).
    Worker(WorkerArgs),
    /// Show the device training would use (after --device, --gpus, $UPCC_DEVICE), its
    /// numerics class and facts, and check that it works: on a GPU this opens it and compiles
    /// and loads the kernels, as a run would.
    Device(DeviceArgs),
    /// The key that signs the results you compute: make one, or print its public half for
    /// colleagues to trust.
    Key(KeyArgs),
}

/// Output formats of `upcc results`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
    Parquet,
}

#[derive(Args, Debug)]
pub struct ResultsArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Output format: an aligned table (scores in percent), or data: csv, json, parquet
    /// (scores as fractions, full node keys).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write to this file instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Two runs side by side with deltas (B − A): each a spec file, a group of overrides
    /// (`'train.epochs=10 train.lr=0.01'`, added to the command's `--set`s), or `-` for the
    /// command's spec and `--set`s as they are.
    #[arg(long, num_args = 2, value_names = ["A", "B"], allow_hyphen_values = true)]
    pub compare: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Spec file (`smoke` for the embedded default).
    #[arg(value_name = "SPEC")]
    pub spec: String,
    /// Override a parameter: `--set constraints.corruption=0.5`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print JSON instead of YAML.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Make a key pair: the secret in a file only you can read, the public key on stdout.
    Generate {
        /// The key's name (default: user@host); shown wherever a result it signed is refused.
        #[arg(long)]
        name: Option<String>,
        /// Where to write the secret key (default: $UPCC_SIGNING_KEY, else
        /// ~/.config/upcc/signing-key).
        #[arg(long, value_name = "PATH")]
        out: Option<PathBuf>,
        /// Replace a key that is there.
        #[arg(long)]
        force: bool,
    },
    /// Print your public key (NAME:BASE64).
    Show,
}

#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Command {
    /// Whether the command prints JSON on stdout (`--json`).
    pub fn json(&self) -> bool {
        match self {
            Command::Run(a) => a.spec.json,
            Command::Status(a) => a.json,
            Command::Explain(a) => a.json,
            Command::Cancel(a) => a.json,
            Command::Push(a) | Command::Pull(a) => a.json,
            Command::Device(a) => a.json,
            Command::Results(a) => a.spec.json,
            Command::Config(a) => a.json,
            Command::Verify
            | Command::Gc(_)
            | Command::Report(_)
            | Command::Job(_)
            | Command::Worker(_)
            | Command::Key(_) => false,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Spec file (`smoke` for the embedded default), then selectors `key=value` (dataset,
    /// supervision, method, pretrain, corruption, budget, trial, target, stage).
    #[arg(value_name = "SPEC [SELECTOR]...", required = true, num_args = 1..)]
    pub spec_and_selectors: Vec<String>,
    /// Override a parameter: `--set constraints.corruption=0.5`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Remote cache to consult and fill: s3://BUCKET[/PREFIX], gs://…, az://…, file:///PATH, or
    /// `off` (default: $UPCC_REMOTE, else the spec's or user config's `remote:`, else none).
    #[arg(long, value_name = "URL|off")]
    pub remote: Option<String>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Keep running independent nodes after a failure.
    #[arg(long)]
    pub keep_going: bool,
    /// Recompute the selected nodes even when fresh (a determinism check).
    #[arg(long)]
    pub force: bool,
    /// CPU threads to use (default: all; $UPCC_THREADS).
    #[arg(long, env = "UPCC_THREADS")]
    pub threads: Option<usize>,
    /// Threads each CPU training node gets (default: 4, at most --threads; $UPCC_NODE_THREADS).
    /// Independent nodes run side by side in the remaining threads; results do not depend on it.
    #[arg(long, env = "UPCC_NODE_THREADS")]
    pub node_threads: Option<usize>,
    /// Memory budget in MiB for the memory slots (default: 80% of available memory, and of
    /// what `ulimit -v` or the cgroup leaves this process).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Progress display on stderr.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    pub progress: ProgressArg,
    /// Where nodes run: `local` (this machine) or `slurm` (a few worker jobs, or one job per
    /// node in `executor.slurm.mode: per-node`, against the shared store). Default: the spec's or user config's `executor.kind`, else
    /// local ($UPCC_EXECUTOR).
    #[arg(long, value_enum, env = "UPCC_EXECUTOR")]
    pub executor: Option<ExecutorArg>,
    /// Slurm: submit and return; `upcc status` shows the jobs and `upcc run` re-attaches. In
    /// workers mode the driver itself runs as a job.
    #[arg(long)]
    pub detach: bool,
    /// Slurm: print the job plan (how many jobs, of which resources, for how many nodes) and
    /// submit nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Spec file, then the driver's selectors.
    #[arg(value_name = "SPEC [SELECTOR]...", required = true, num_args = 1..)]
    pub spec_and_selectors: Vec<String>,
    /// Which nodes: `training` (they train networks on the device) or `other`.
    #[arg(long, value_enum)]
    pub kind: WorkerKind,
    /// This job's Slurm log (`%j`: the job id), named in the records of the nodes it computes.
    #[arg(long, default_value = "")]
    pub log: String,
    /// Seconds to wait for more nodes of its kind to become ready (their inputs computed by
    /// other jobs) before ending.
    #[arg(long, default_value_t = 300.0)]
    pub linger: f64,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Remote cache (as for `run`).
    #[arg(long, value_name = "URL|off")]
    pub remote: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkerKind {
    Training,
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExecutorArg {
    Local,
    Slurm,
}

#[derive(Args, Debug)]
pub struct JobArgs {
    /// Spec file and the node id.
    #[arg(value_name = "SPEC NODE", required = true, num_args = 2)]
    pub spec_and_node: Vec<String>,
    /// The node's recipe the job was submitted for (hex, as `pipeline/cli/slurm.rs::recipes`
    /// computes it; `upcc job` refuses a node whose recipe differs).
    #[arg(long)]
    pub recipe: String,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Remote cache (as for `run`); the job downloads its node when the remote holds it, and
    /// uploads it after computing it.
    #[arg(long, value_name = "URL|off")]
    pub remote: Option<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ProgressArg {
    Auto,
    Bars,
    Plain,
    None,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// Spec file.
    #[arg(value_name = "SPEC")]
    pub spec: String,
    /// The node id (`upcc status SPEC` lists them) or a key prefix.
    #[arg(value_name = "NODE")]
    pub node: Option<String>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct GcArgs {
    /// Specs whose targets (with their default parameters) are kept.
    #[arg(value_name = "SPEC", required = true, num_args = 1..)]
    pub specs: Vec<String>,
    /// Keep anything written within this many minutes (writers in flight are never robbed).
    #[arg(long, default_value_t = 60, allow_negative_numbers = true)]
    pub grace_minutes: i64,
    /// Only report what would be deleted, naming each result (and those kept only for being
    /// recent).
    #[arg(long)]
    pub dry_run: bool,
    /// Also keep what the specs reach with these overrides (the results of a `run --set …`),
    /// besides what they reach as written.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Also collect the remote cache (the configured one, or URL): the same roots rule, and
    /// the same grace. Without it, gc never deletes anything from a remote.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub remote: Option<String>,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Spec file, then `target=NAME[,NAME…]` to report only those targets.
    #[arg(value_name = "SPEC [target=NAME]...", required = true, num_args = 1..)]
    pub spec_and_selectors: Vec<String>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Folder to write into: `index.html`, and one folder per target with its files.
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
}
