//! `farm repair RUN_DIR`: moves the lines of a run's journals that are not records into side
//! files, byte for byte, so `--resume` (or a `farm serve` restart) can go on with every other
//! row. Nothing is deleted.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct RepairArgs {
    /// A run folder of `farm run` or `farm serve`.
    run: PathBuf,
}

pub async fn run(args: RepairArgs) -> Result<i32> {
    let dir = args.run.clone();
    let repaired =
        tokio::task::spawn_blocking(move || engine::recorder::files::repair(&dir, crate::serve::is_request_record))
            .await??;
    for file in &repaired {
        let name = file.file.display();
        match (&file.quarantine, file.bad_lines.as_slice(), file.torn_bytes) {
            (None, [], 0) => crate::ui::outln!("{name}: sound, left as it is"),
            (quarantine, lines, torn) => {
                if let Some(q) = quarantine {
                    crate::ui::outln!(
                        "{name}: moved {} line(s) ({}) to {}",
                        lines.len(),
                        lines.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", "),
                        q.display()
                    );
                }
                if torn > 0 {
                    crate::ui::outln!("{name}: cut a torn last line of {torn} bytes (an append that never finished)");
                }
            }
        }
    }
    Ok(0)
}
