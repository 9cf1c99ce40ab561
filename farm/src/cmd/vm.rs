//! `farm vm run`: boot a microVM, run one command through the guest agent, mirror its
//! output and exit code.

use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use vmm::{AccelSetting, ExecOptions, GuestArtifacts, Machine, VmSettings};

#[derive(Subcommand)]
pub enum VmCommand {
    /// Boot a microVM from an image and run a command in it.
    ///
    /// The command's standard input, output and error are passed through; farm exits with
    /// the command's exit code (128 + signal if it was killed, 124 on timeout).
    Run(RunArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// Root image: `minimal` (busybox) or `python` (Debian with python3 and git).
    #[arg(long, default_value = "minimal")]
    image: String,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(64..=65536))]
    memory: u32,
    /// Virtual CPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    cpus: u32,
    /// Kill the command (its whole process group) after this many seconds; exit code 124.
    #[arg(long)]
    timeout: Option<f64>,
    /// Environment variable for the command, KEY=VALUE (repeatable); set over the image's
    /// own Env, as `docker run -e` does.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Working directory inside the guest (default: the image's WorkingDir, else /workspace).
    #[arg(long)]
    workdir: Option<String>,
    /// Run the command as this guest user: a name, UID or UID:GID (default: the image's
    /// User, else root).
    #[arg(long)]
    user: Option<String>,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: AccelSetting,
    /// Seconds to wait for the guest agent after starting QEMU.
    #[arg(long, default_value_t = 300.0)]
    boot_timeout: f64,
    /// Print timings (boot, command) to standard error.
    #[arg(short, long)]
    verbose: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// A `--env` value that is not `KEY=VALUE`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not KEY=VALUE")]
struct NotKeyValue(String);

fn parse_env(s: &str) -> Result<(String, String), NotKeyValue> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(NotKeyValue(s.to_string())),
    }
}

/// Bytes of each output stream kept; beyond this the output is cut and a warning printed.
const OUTPUT_CAP: u64 = 32 << 20;

pub async fn run(command: VmCommand) -> Result<i32> {
    match command {
        VmCommand::Run(args) => run_command(args).await,
    }
}

async fn run_command(args: RunArgs) -> Result<i32> {
    let timeout = match args.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => bail!("--timeout must be a positive number of seconds, got {t}"),
        t => t.map(Duration::from_secs_f64),
    };
    let artifacts = GuestArtifacts::locate(&vmm::artifacts::cache_dir(), &args.image)?;
    let mut settings = VmSettings::detect(args.accel)?;
    settings.memory_mib = args.memory;
    settings.cpus = args.cpus;
    settings.boot_timeout = Duration::from_secs_f64(args.boot_timeout.max(1.0));

    let stdin = read_stdin()?;
    let image = images::config_of(&artifacts.image).unwrap_or_default();
    let options = exec_options(&args, &image, stdin, timeout);

    let started = Instant::now();
    let machine = Machine::boot(&settings, &artifacts.kernel.path, &artifacts.image.path).await?;
    let booted = started.elapsed();
    let output = match machine.agent().exec(options).await {
        Ok(output) => output,
        Err(vmm::AgentError::Refused {
            kind: farm_protocol::ErrorKind::Spawn,
            message,
            ..
        }) => {
            // Like a shell: the command could not be started.
            eprintln!("farm: {message}");
            machine.shutdown().await;
            return Ok(127);
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "running {:?} in the guest; last lines of the serial console:\n{}",
                args.command,
                machine.console_tail(10)
            )))
        }
    };
    if std::env::var_os("FARM_TEST_PANIC_AFTER_EXEC").is_some() {
        // Test aid: proves the no-orphan guarantee on the panic path.
        panic!("FARM_TEST_PANIC_AFTER_EXEC is set");
    }
    let ran = started.elapsed() - booted;
    machine.shutdown().await;

    std::io::stdout()
        .write_all(&output.stdout)
        .context("writing standard output")?;
    std::io::stdout().flush().ok();
    std::io::stderr().write_all(&output.stderr).ok();
    let r = &output.result;
    if r.stdout_truncated || r.stderr_truncated {
        eprintln!("farm: warning: output beyond {OUTPUT_CAP} bytes per stream was dropped");
    }
    if args.verbose {
        print_timings(&settings, booted, &output, ran);
    }
    if r.timed_out {
        eprintln!(
            "farm: command timed out after {:.1} s and was killed",
            timeout.unwrap_or_default().as_secs_f64()
        );
        return Ok(124);
    }
    Ok(output.shell_exit_code())
}

/// Standard input goes to the command in full; a terminal gives none.
fn read_stdin() -> Result<Vec<u8>> {
    if std::io::stdin().is_terminal() {
        return Ok(Vec::new());
    }
    let mut buf = Vec::new();
    std::io::stdin()
        .read_to_end(&mut buf)
        .context("reading standard input")?;
    Ok(buf)
}

/// The command as it runs: an image converted from an archive runs its commands as `docker
/// run` would, with its config's Env (under --env), WorkingDir and User. Built-in images
/// have no config.
fn exec_options(args: &RunArgs, image: &images::ImageConfig, stdin: Vec<u8>, timeout: Option<Duration>) -> ExecOptions {
    let env = image.env_with(args.env.iter().map(|(k, v)| (k, v)));
    let cwd = args
        .workdir
        .clone()
        .or_else(|| (!image.working_dir.is_empty()).then(|| image.working_dir.clone()));
    let user = match &args.user {
        Some(user) if user == "root" || user == "0" => None,
        Some(user) => Some(user.clone()),
        None => (!image.user.is_empty() && image.user != "root" && image.user != "0").then(|| image.user.clone()),
    };
    ExecOptions {
        cwd,
        env,
        user,
        stdin,
        timeout,
        stdout_cap: OUTPUT_CAP,
        stderr_cap: OUTPUT_CAP,
        ..ExecOptions::argv(&args.command)
    }
}

/// `--verbose`: boot and command times (and a host without the cgroups farm would use).
fn print_timings(settings: &VmSettings, booted: Duration, output: &vmm::ExecOutput, ran: Duration) {
    if let Some(note) = vmm::jail::missing_cgroups_note() {
        eprintln!("farm: {note}");
    }
    eprintln!(
        "farm: accel {} boot {:.0} ms, command {:.1} ms in guest, {:.1} ms round trip",
        settings.accel,
        booted.as_secs_f64() * 1e3,
        output.result.duration_us as f64 / 1e3,
        ran.as_secs_f64() * 1e3
    );
}
