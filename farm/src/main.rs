//! `farm`: the command line. Parses arguments, then hands each subcommand to its module.
//!
//! Every QEMU this process starts dies with it (see `vmm::process`); the panic hook and the
//! signal handling here only make teardown orderly (run folders removed, exit codes right).
#![forbid(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

mod cmd;
mod metrics_http;
mod report;
mod run;
mod serve;
mod signals;
mod ui;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "farm",
    version,
    about = "A rollout farm: microVM snapshots, copy-on-write forks, protected scoring."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an eval suite: every task's rollouts in forks, scored, written to Parquet.
    Run(run::RunArgs),
    /// Serve rollouts and live sessions over HTTP to training loops.
    Serve(serve::ServeArgs),
    /// Write a static HTML report of one or more runs: leaderboard, tasks, charts, rollouts.
    Report(report::ReportArgs),
    /// Run commands in microVMs.
    #[command(subcommand)]
    Vm(cmd::vm::VmCommand),
    /// Build template snapshots.
    #[command(subcommand)]
    Template(cmd::template::TemplateCommand),
    /// List and remove snapshots.
    #[command(subcommand)]
    Snapshot(cmd::snapshot::SnapshotCommand),
    /// Benchmarks: boot and fork latency, memory per fork.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Move journal lines that are not records into side files, so a run can resume.
    Repair(cmd::repair::RepairArgs),
    /// Combine the run folders of a suite's shards (`farm run --shard I/N`) into one run.
    Merge(cmd::merge::MergeArgs),
    /// Tenants of `farm serve`: keys, quotas, network grants, and the audit of their calls.
    Tenant(cmd::tenant::TenantArgs),
    /// Print the OpenAPI document of `farm serve`'s HTTP API (as `GET /v1/openapi.json`).
    Openapi,
    /// E2B's SDK on farm: the settings that point it at a `farm serve` (docs/e2b.md).
    #[command(subcommand)]
    E2b(cmd::e2b::E2bCommand),
}

fn main() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // A panic on the main thread ends the process: its QEMUs go first. A panic in a
        // task (one rollout, one request) is caught by the runtime and becomes that
        // rollout's env_error; it must not take every other VM down with it.
        if std::thread::current().name() == Some("main") {
            vmm::process::kill_all();
        }
        default_hook(info);
    }));
    let cli = Cli::parse();
    // A few descriptors per VM: the soft limit must not be what caps the number of VMs.
    let _ = vmm::process::raise_open_file_limit();
    ui::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("starting the async runtime");
    let mut cli_rest = None;
    let code = runtime.block_on(async {
        // `farm run` and `farm serve` handle SIGINT/SIGTERM themselves: they stop, record
        // and summarise.
        let handled = match cli.command {
            Command::Run(args) => Some(run::run(args).await),
            Command::Serve(args) => Some(serve::run(args).await),
            other => {
                cli_rest = Some(other);
                None
            }
        };
        if let Some(result) = handled {
            return match result {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("farm: error: {e:#}");
                    1
                }
            };
        }
        let command = cli_rest.take().expect("the other commands");
        let work = async {
            match command {
                Command::Run(_) | Command::Serve(_) => unreachable!("handled above"),
                Command::Vm(command) => cmd::vm::run(command).await,
                Command::Template(command) => cmd::template::run(command).await,
                Command::Snapshot(command) => cmd::snapshot::run(command).await,
                Command::Bench(command) => cmd::bench::run(command).await,
                Command::Report(args) => report::run(args).await,
                Command::Repair(args) => cmd::repair::run(args).await,
                Command::Merge(args) => cmd::merge::run(args).await,
                Command::Tenant(args) => cmd::tenant::run(args),
                Command::E2b(command) => cmd::e2b::run(command),
                Command::Openapi => {
                    crate::ui::outln!("{}", serve::routes::json());
                    Ok(0)
                }
            }
        };
        tokio::select! {
            result = work => match result {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("farm: error: {e:#}");
                    1
                }
            },
            code = cmd::shutdown_signal() => code,
        }
    });
    // Dropping the runtime drops every machine still owned by a task: QEMUs are killed and
    // run folders removed before the process exits.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    vmm::process::kill_all();
    std::process::exit(code);
}
