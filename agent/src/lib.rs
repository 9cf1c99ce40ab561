//! The guest side of farm, as a library shared by its two programs:
//!
//! - `farm-agent`, the guest's PID 1 and request server (`src/main.rs`);
//! - `farm-sandbox`, the setuid helper a test command uses to run the agent's code as the
//!   unprivileged candidate user (`src/bin/farm-sandbox.rs`).
//!
//! A request flows from the host's frame through `main.rs`'s router to the module that owns
//! it: [`exec`] runs commands (as root or another [`users`] user), [`files`] reads and
//! writes files (confined to a folder when the host places an agent's files), [`sweep`]
//! kills processes natively, [`testrun`] runs hidden tests and reads their verdict only after
//! the sweep, [`zygote`] runs function-call checks in the harness zygote without starting
//! a process, and [`reset`] makes a scoring VM that serves many checks ready for the next. Every `unsafe` block lives in [`sys`].

#![deny(unsafe_code)]

pub mod exec;
pub mod files;
pub mod folders;
pub mod net;
pub mod process;
pub mod reset;
pub mod sweep;
#[allow(unsafe_code)]
pub mod sys;
pub mod testrun;
pub mod users;
pub mod zygote;

/// An error and its causes on one line (`what failed: why: why`), for the message of an
/// error sent to the host.
pub fn describe(error: &dyn std::error::Error) -> String {
    let chain = std::iter::successors(Some(error), |e| e.source());
    chain.map(|e| e.to_string()).collect::<Vec<_>>().join(": ")
}
