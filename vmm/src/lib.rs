//! The machine layer: microVMs under QEMU.
//!
//! Data flows through it like this: [`artifacts`] finds the guest kernel and image built by
//! `scripts/setup.sh` (an image that is not built in is converted by the `images` crate, which
//! owns root images; the guest's network proxy is the `egress` crate's); [`accel`] picks KVM or TCG for this host; [`qemu`] turns a
//! [`qemu::MachineSpec`] into QEMU's command line (a TCG guest is told the host's TSC
//! frequency, measured by [`tsc`]); [`process`] starts QEMU so that it dies
//! with its owner; [`machine::Machine`] ties the process to its QMP connection ([`qmp`]) and
//! its guest agent channel ([`agent`]), and boots, snapshots (state-only migration) and
//! resumes guests. Every QEMU runs jailed ([`jail`]): its own uid, seccomp, rlimits, no
//! inherited environment or descriptors, files passed as descriptors (the disk chain found by
//! [`qcow2`]), the console read into a bounded log ([`console`]).
//!
//! `unsafe` is confined to [`process`] (fork-time set-up of QEMU children) and one read of
//! the TSC in [`tsc`].
#![deny(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod accel;
pub mod agent;
pub mod artifacts;
pub mod console;
pub mod jail;
pub mod ksm;
pub mod machine;
pub mod memory;
#[allow(unsafe_code)]
pub mod process;
pub mod qcow2;
pub mod qemu;
pub mod qmp;
pub mod tsc;

pub use accel::{Accel, AccelSetting};

/// An error and its causes on one line (`what failed: why: why`).
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}
pub use agent::{AgentClient, AgentError, ExecOptions, ExecOutput, FilePlacement, TestsOutput};
pub use artifacts::GuestArtifacts;
pub use ksm::Ksm;
pub use machine::{Machine, MachineError, ResetTimings, VmSettings};
