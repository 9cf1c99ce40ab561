//! `farm template build`: boot a template, run its setup, snapshot it (or reuse the
//! snapshot its inputs already produced).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use snapshotter::{build_template, Forker, SnapshotStore, TemplateConfig};
use vmm::{AccelSetting, VmSettings};

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Build the snapshot of a template file (a TOML file with a `[template]` table).
    ///
    /// The snapshot is content-addressed: the same config, files, kernel, image, agent, QEMU
    /// and accelerator reuse the existing snapshot; any change builds a new one.
    Build(BuildArgs),
}

#[derive(Args)]
pub struct BuildArgs {
    /// The template file.
    config: PathBuf,
    /// Accelerator: auto, kvm or tcg.
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: AccelSetting,
    /// Print only the snapshot id.
    #[arg(short, long)]
    quiet: bool,
}

pub async fn run(command: TemplateCommand) -> Result<i32> {
    match command {
        TemplateCommand::Build(args) => build(args).await,
    }
}

async fn build(args: BuildArgs) -> Result<i32> {
    let template = TemplateConfig::load(&args.config)?;
    let base_dir = args.config.parent().map(PathBuf::from).unwrap_or_default();
    let base_dir = if base_dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base_dir
    };
    let label = args
        .config
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "template".into());
    let forker = Forker::new(VmSettings::detect(args.accel)?)?;
    let store = SnapshotStore::default_location();
    let started = Instant::now();
    let quiet = args.quiet;
    let progress = move |line: &str| {
        if !quiet {
            eprintln!("farm: {line}");
        }
    };
    if let Some(note) = vmm::jail::missing_cgroups_note() {
        progress(&note);
    }
    let built = build_template(&store, &forker, &template, &base_dir, &label, &progress)
        .await
        .with_context(|| format!("building template {}", args.config.display()))?;
    if quiet {
        crate::ui::outln!("{}", built.snapshot.id());
    } else {
        let verb = if built.reused {
            "reused existing snapshot"
        } else {
            "built snapshot"
        };
        crate::ui::outln!(
            "{verb} {} in {:.1} s ({})",
            built.snapshot.id(),
            started.elapsed().as_secs_f64(),
            built.snapshot.dir.display()
        );
    }
    Ok(0)
}
