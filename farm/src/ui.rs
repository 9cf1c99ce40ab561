//! What farm tells the person running it. Every line is a `tracing` event; by default only
//! farm's own (`farm: ...` on standard error, control characters escaped so nothing a
//! rollout produced can move the cursor or retitle the terminal), above a progress bar
//! (`indicatif`) when standard error is a terminal. `FARM_LOG` sets a filter for structured
//! logs of every crate instead (`FARM_LOG=info`, `FARM_LOG=engine=debug`), as JSON lines with
//! `FARM_LOG_FORMAT=json`; each rollout is a span carrying `run_id`, `task_id`, `sample` and
//! `fork_id`.

use std::io::{IsTerminal, Write};
use std::sync::{Mutex, OnceLock};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing_subscriber::fmt::{format, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `println!` that ends the process quietly when stdout is a closed pipe (`farm ... | head`)
/// instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}
pub(crate) use outln;

/// The progress bar being drawn, if any: log lines are printed above it.
fn active_bar() -> &'static Mutex<Option<ProgressBar>> {
    static BAR: OnceLock<Mutex<Option<ProgressBar>>> = OnceLock::new();
    BAR.get_or_init(|| Mutex::new(None))
}

/// Installs the log subscriber (once, at start).
pub fn init() {
    let structured = std::env::var("FARM_LOG").ok();
    let filter = match &structured {
        Some(f) => tracing_subscriber::EnvFilter::try_new(f).unwrap_or_else(|e| {
            eprintln!("farm: FARM_LOG={f:?} is not a log filter ({e}); expected e.g. \"info\" or \"engine=debug\"");
            std::process::exit(2);
        }),
        None => tracing_subscriber::EnvFilter::new("farm=info,service=info"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| BarWriter(Vec::new()))
        .with_target(false);
    match structured {
        Some(_) if std::env::var("FARM_LOG_FORMAT").is_ok_and(|f| f == "json") => {
            builder.json().with_current_span(true).with_span_list(false).init()
        }
        Some(_) => builder.with_ansi(false).init(),
        None => builder.event_format(FarmLines).init(),
    }
}

/// Text fit for a terminal: control characters (a guest's file names, a candidate's error
/// text) are shown escaped.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `farm: <message>`, escaped: farm's own lines as people have always seen them.
struct FarmLines;

impl<S, N> FormatEvent<S, N> for FarmLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut text = String::new();
        ctx.format_fields(format::Writer::new(&mut text), event)?;
        writeln!(writer, "farm: {}", printable(&text))
    }
}

/// A log line on its way to standard error: written above the progress bar, if one is
/// drawn.
struct BarWriter(Vec<u8>);

impl Write for BarWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for BarWriter {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.0);
        let print = || {
            let _ = std::io::stderr().write_all(&bytes);
        };
        match active_bar().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }
}

/// Progress of `total` rollouts: a bar on a terminal (done/total, rate, ETA, counts by
/// status in its message), nothing elsewhere (callers log a line per rollout instead).
pub struct Progress {
    bar: ProgressBar,
    pub tty: bool,
}

impl Progress {
    pub fn new(total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let target = if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total as u64), target);
        let style = ProgressStyle::with_template("[{bar:30}] {pos}/{len} {per_sec} ETA {eta} | {msg}")
            .expect("a valid template")
            .progress_chars("#> ");
        bar.set_style(style);
        *active_bar().lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
        Progress { bar, tty }
    }

    /// One more rollout done; `message` is the counts so far.
    pub fn step(&self, message: String) {
        self.bar.set_message(message);
        self.bar.inc(1);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish();
        *active_bar().lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_text_cannot_carry_terminal_controls() {
        assert_eq!(
            printable("ok \u{1b}]0;PWNED\u{7}\r\nnext"),
            "ok \\u{1b}]0;PWNED\\u{7}\\u{d}\\u{a}next"
        );
        assert_eq!(printable("plain: text"), "plain: text");
    }
}
