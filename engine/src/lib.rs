//! The rollout engine, as a library: what `farm run` (a suite, start to end) and `farm serve`
//! (rollouts, live sessions and sandboxes on request) are front-ends of. It knows nothing of
//! either.
//!
//! Two layers: the host core ([`Host`]: the forker, the snapshot store, template builds and
//! warm pools), which starts without any suite and is all the sandbox API needs; and the
//! suite engine on top of it ([`Engine`]: one suite's template, task snapshots, policy,
//! scoring and rows).
//!
//! The life of a suite, stage by stage, each in the crate that owns it:
//! 1. load: [`config::Suite::load`] (the suite model) and [`config::Suite::tasks`]
//!    (`datasets`);
//! 2. plan: [`Engine::plan`] (which task, which sample, which seed), for a [`policy::Policy`];
//! 3. prepare: [`Engine::start`] builds or reuses the template snapshot on the host,
//!    [`Engine::prepare`] the per-task snapshots (`snapshotter`);
//! 4. run: [`Engine::run_one`] for each planned rollout (see below);
//! 5. record: the [`recorder::Recorder`] owns every write (journal, Parquet parts, manifest,
//!    summary, metrics) on a thread of its own.
//!
//! The life of a rollout (`Engine::rollout`, in `rollout.rs`): fork the task's snapshot →
//! the policy acts → collect the artifacts, as untrusted data → score in a fresh fork of the
//! pristine snapshot, where the agent cannot reach (`scorers`) → settle: how it ended
//! ([`end::End`]) becomes the row's status, reward and error in one place.
//!
//! Live forks a caller holds open have one lifecycle, whatever the front-end: a session
//! (`farm serve`'s session API, OpenEnv, MCP: the same pieces as a rollout, stepped by a
//! caller) and a sandbox (the sandbox API: no task, no verdict) are one
//! [`session::Session`] with an optional task (open, act, branch, pause, resume, snapshot,
//! submit, end, each with a typed outcome); [`book::Book`] keeps a service's open forks
//! (slots, timers, who is submitting, how each ended), [`idempotency::Keys`] its idempotency
//! keys, and [`guest::Guest`] drives a sandbox's guest.
#![forbid(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod action;
pub mod book;
pub mod config;
pub mod end;
mod engine;
pub mod environment;
pub mod errors;
pub mod guest;
pub mod harbor;
pub mod host;
pub mod idempotency;
pub mod idle_vms;
pub mod live;
pub mod metrics;
pub mod pause;
pub mod policy;
pub mod recorder;
mod rollout;
pub mod row;
pub mod sandbox;
pub mod session;

pub mod shard;
pub mod sizing;

pub use action::{observation, Submitted};
pub use end::End;
pub use engine::{
    describe, rollout_seed, Engine, EngineError, ForkTaskError, HostChoices, Planned, Served, TaskSnapshot,
    TaskSnapshots,
};
pub use host::Host;
pub use live::{Branch, BranchError, LiveFork};
pub use policy::Policy;

/// The snapshot layer's types a front-end holds (a snapshot, the store it lives in, a warm
/// pool, a template's network): front-ends drive them through the engine, never the machine
/// or snapshot layers themselves.
pub mod snapshots {
    pub use snapshotter::template::{hex, BadAllowEntry};
    pub use snapshotter::{Fork, Network, PoolCounts, PoolSize, Snapshot, SnapshotStore, WarmPool};
}
/// What a suite's harness zygote imports before the template's snapshot ([`Engine::start`]).
pub use scorers::zygote::Preload;
