//! Warm pools: VMs of one snapshot kept ready, so that a fork skips the dearest part of a
//! start, and VMs given back when their user is done, so that the next start is a reset.
//!
//! A pool keeps its **target** of machines ready (resumed, warmed, waiting only for an
//! identity), refilled in the background, and **spares**: VMs given back
//! ([`WarmPool::give_back`]) when their user is done. A spare goes back stopped (its QEMU
//! process `SIGSTOP`ped, its network closed); the refill resets it exactly to the snapshot in
//! the same process ([`vmm::Machine::reset_paused`]: memory, devices, disk and the host's
//! channels) and keeps it paused, using no CPU and only the memory of a process. Under TCG the
//! process keeps the code it translated, so a spare resumed is several times cheaper than a
//! new process. The refill makes ready machines from spares first, then from new processes;
//! a take that finds nothing ready resumes a spare, and only then starts a new process.
//!
//! The target is `base` (the configured `warm_pool`) plus the takes that found nothing ready
//! in the last `window` ([`DEMAND_WINDOW`] unless set), at most `max`: a burst makes the pool grow for the next one,
//! and a pool that has not run short for a window shrinks back to `base` (the machines past
//! it are stopped). Past `base` it grows by new processes only when `base` is not 0 and
//! `room` says the host has memory for one more. Spares are kept while the ready ones and the
//! spares are at most the target, plus one; a spare unused for a window is stopped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm::Machine;

use crate::fork::{apply_identity, load_and_resume, Fork, ForkError, ForkIdentity, Forker, Start};
use crate::store::Snapshot;

/// How long a take that found the pool empty keeps the pool grown by one, by default.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(120);

/// The longest a reset of a VM given back may take before the VM is stopped instead.
const RESET_LIMIT: Duration = Duration::from_secs(30);

/// How often the refill looks at its target when nothing else wakes it.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// What a warm pool keeps ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolMode {
    /// QEMU processes started and waiting for incoming state: a fork still loads the
    /// state, resumes, and pays the first-run cost of a fresh process (under TCG, code is
    /// translated again in every process). VMs given back are not kept.
    #[default]
    Incoming,
    /// Forks already resumed and warmed by one trivial command, waiting only for their
    /// identity (entropy, clock, hostname, seed), which is applied when they are taken,
    /// before any user command. Fastest; the guest has run a little before being taken.
    Resumed,
}

/// What a pool's resumed machine runs once before it waits, so that a take and its first
/// command find the guest code they run already translated (under TCG a new QEMU process
/// translates each code path the first time it runs it): `shell`, a shell command; `true`
/// given as argv when `argv` (for clients that send argv commands, as the sandbox API's do;
/// the agent's path for those differs from the shell's); then always an identity of its own,
/// which the take's replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmUp {
    pub shell: String,
    pub argv: bool,
}

impl WarmUp {
    /// A shell command alone (and the identity).
    pub fn shell(command: &str) -> WarmUp {
        WarmUp {
            shell: command.to_string(),
            argv: false,
        }
    }
}

/// How many machines a pool keeps.
#[derive(Clone)]
pub struct PoolSize {
    /// Kept ready whatever the demand.
    pub base: usize,
    /// The most it grows to with demand (never below `base`).
    pub max: usize,
    /// Whether the host has room for one more VM past `base` (memory admission); None:
    /// always.
    pub room: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// How long a take that found nothing ready keeps the pool grown by one, and how long
    /// a spare is kept unused.
    pub window: Duration,
}

impl PoolSize {
    /// Exactly `n`, not growing.
    pub fn fixed(n: usize) -> PoolSize {
        PoolSize {
            base: n,
            max: n,
            room: None,
            window: DEMAND_WINDOW,
        }
    }
}

/// What a pool holds and did since it started (the sandbox API shows it as an environment's
/// `pool`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = PoolView))]
pub struct PoolCounts {
    /// Forks ready now.
    pub ready: usize,
    /// VMs given back (of ended sandboxes), kept reset and paused for later starts.
    pub spares: usize,
    /// How many it aims to keep ready now (its base, grown by recent takes that found none).
    pub target: usize,
    /// Forks made ready by a new QEMU process.
    pub started: u64,
    /// Forks made ready by a reset of a VM given back.
    pub reset: u64,
    /// Resets that failed (the VM was stopped; a new process took its place).
    pub reset_failed: u64,
    /// Takes that found nothing ready.
    pub missed: u64,
}

/// A machine ready to be taken, and how it came to be in the snapshot's state.
struct ReadyVm {
    machine: Machine,
    start: Start,
    /// The owner of the VM given back it was made from: only that owner takes it (None: a
    /// new process, anyone's).
    owner: Option<u64>,
}

/// A VM given back.
struct Spare {
    machine: Machine,
    /// Reset to the snapshot and paused (else stopped as its user left it).
    clean: bool,
    since: Instant,
    /// Who gave it back: a VM is only ever reused by its owner (a tenant), so that a QEMU
    /// process one owner's guest could have subverted never serves another's.
    owner: u64,
}

/// VMs of one snapshot, kept ready and refilled in the background.
pub struct WarmPool {
    inner: Arc<PoolInner>,
    refill: tokio::task::JoinHandle<()>,
}

struct PoolInner {
    forker: Forker,
    snapshot: Snapshot,
    size: PoolSize,
    mode: PoolMode,
    /// What a resumed machine runs before it waits.
    warm_up: WarmUp,
    ready: Mutex<VecDeque<ReadyVm>>,
    /// Given back: stopped as their users left them, or reset and paused.
    spares: Mutex<Vec<Spare>>,
    /// When takes found nothing ready, within the last window.
    misses: Mutex<VecDeque<Instant>>,
    /// Woken when a machine is taken or given back (notify_one keeps a permit if nobody
    /// waits yet).
    wanted: Arc<tokio::sync::Notify>,
    /// The last error the refill task met (it retries after a pause).
    last_error: Mutex<Option<String>>,
    started: AtomicU64,
    reset: AtomicU64,
    reset_failed: AtomicU64,
    missed: AtomicU64,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PoolInner {
    /// A new QEMU process in the snapshot's state, resumed and warmed in `Resumed` mode.
    async fn make_ready(&self) -> Result<Machine, ForkError> {
        let machine = self.forker.prepare(&self.snapshot).await?;
        if self.mode == PoolMode::Resumed {
            load_and_resume(&machine, &self.snapshot).await?;
            self.warm(&machine, true).await?;
        }
        Ok(machine)
    }

    /// Runs the pool's [`WarmUp`] once (what the take and a first command will run; measured
    /// in bench/RESULTS.md). `identity`: its identity too (not for a machine whose take's
    /// identity follows at once).
    async fn warm(&self, machine: &Machine, identity: bool) -> Result<(), ForkError> {
        let mut runs = vec![vmm::ExecOptions::shell(self.warm_up.shell.clone())];
        if self.warm_up.argv {
            runs.push(vmm::ExecOptions::argv(&["true"]));
        }
        for mut options in runs {
            options.timeout = Some(Duration::from_secs(120));
            machine
                .agent()
                .exec(options)
                .await
                .map_err(|source| ForkError::Identity {
                    snapshot: self.snapshot.id().to_string(),
                    source,
                })?;
        }
        if !identity {
            return Ok(());
        }
        // The take's identity replaces every part of this one (the same variables, the
        // hostname, the clock) and adds its own entropy, reseeding the guest's RNG.
        let warm_identity = ForkIdentity {
            fork_id: "warm".into(),
            seed: 0,
            env: Vec::new(),
        };
        crate::fork::identify(machine, self.snapshot.id(), &warm_identity).await
    }

    /// A VM given back, put back exactly to the snapshot in its own process, left paused.
    async fn clean(&self, machine: &mut Machine) -> Result<(), ForkError> {
        let machine_err = |source| ForkError::Machine {
            snapshot: self.snapshot.id().to_string(),
            source,
        };
        machine.thaw();
        // A QEMU that does not answer its monitor must not hold the pool's refill.
        match tokio::time::timeout(RESET_LIMIT, machine.reset_paused()).await {
            Ok(reset) => reset.map(|_| ()).map_err(machine_err),
            Err(_) => Err(machine_err(vmm::MachineError::Io {
                what: format!("resetting a VM given back (no answer in {} s)", RESET_LIMIT.as_secs()),
                source: std::io::ErrorKind::TimedOut.into(),
            })),
        }
    }

    /// A spare, reset when it was not yet, resumed and warmed (the warm-up's first command
    /// after the reset takes the cost of the pages it touches, which the first user's command
    /// would otherwise pay); `kept`: to be kept ready, so its warm-up includes an identity.
    async fn resume_spare(&self, mut spare: Spare, kept: bool) -> Result<Machine, ForkError> {
        let outcome = async {
            if !spare.clean {
                self.clean(&mut spare.machine).await?;
            }
            spare.machine.resume().await.map_err(|source| ForkError::Machine {
                snapshot: self.snapshot.id().to_string(),
                source,
            })?;
            self.warm(&spare.machine, kept).await
        }
        .await;
        match outcome {
            Ok(()) => {
                self.reset.fetch_add(1, Ordering::Relaxed);
                Ok(spare.machine)
            }
            Err(e) => {
                self.reset_failed.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// The first spare not yet reset, reset now (false when there was none).
    async fn clean_one(&self) -> bool {
        let dirty = {
            let mut spares = locked(&self.spares);
            let at = spares.iter().position(|s| !s.clean);
            at.map(|i| spares.swap_remove(i))
        };
        let Some(mut spare) = dirty else { return false };
        match self.clean(&mut spare.machine).await {
            Ok(()) => {
                spare.clean = true;
                locked(&self.spares).push(spare);
            }
            Err(e) => {
                self.reset_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    snapshot = self.snapshot.id(),
                    "warm pool: a VM given back did not reset: {e}"
                );
                *locked(&self.last_error) = Some(e.to_string());
                kill_later(spare.machine);
            }
        }
        true
    }

    /// A spare of `owner` to resume (any owner's when None: the refill's): a clean one first.
    fn take_spare(&self, owner: Option<u64>) -> Option<Spare> {
        let mut spares = locked(&self.spares);
        let mine = |s: &Spare| owner.is_none_or(|o| s.owner == o);
        let at = spares
            .iter()
            .position(|s| s.clean && mine(s))
            .or_else(|| spares.iter().position(mine))?;
        Some(spares.swap_remove(at))
    }

    /// A ready machine `owner` may take: a new process's, or one made from its own VM.
    fn take_ready(&self, owner: Option<u64>) -> Option<ReadyVm> {
        let mut ready = locked(&self.ready);
        let at = ready.iter().position(|r| r.owner.is_none() || r.owner == owner)?;
        ready.remove(at)
    }

    fn target(&self) -> usize {
        let mut misses = locked(&self.misses);
        while misses.front().is_some_and(|t| t.elapsed() > self.size.window) {
            misses.pop_front();
        }
        (self.size.base + misses.len()).min(self.size.max.max(self.size.base))
    }

    fn has_room(&self) -> bool {
        self.size.room.as_ref().is_none_or(|room| room())
    }

    /// Stops the ready machines past the target (the last made first), and the spares past
    /// the target (plus one) or unused for a window.
    fn trim(&self, target: usize) {
        let mut gone = Vec::new();
        {
            let mut ready = locked(&self.ready);
            while ready.len() > target {
                gone.extend(ready.pop_back().map(|r| r.machine));
            }
            let ready = ready.len();
            let mut spares = locked(&self.spares);
            spares.sort_by_key(|s| std::cmp::Reverse(s.since));
            while spares.last().is_some_and(|s| s.since.elapsed() > self.size.window)
                || ready + spares.len() > target + 1
            {
                gone.extend(spares.pop().map(|s| s.machine));
            }
        }
        for machine in gone {
            kill_later(machine);
        }
    }

    /// One step of the refill: false when there was nothing to do.
    async fn refill_one(&self) -> bool {
        let target = self.target();
        self.trim(target);
        // A VM given back is reset first: until then it holds the memory its last user
        // dirtied.
        if self.clean_one().await {
            return true;
        }
        let have = locked(&self.ready).len();
        if have >= target {
            return false;
        }
        let made = match self.take_spare(None) {
            Some(spare) => {
                let owner = Some(spare.owner);
                self.resume_spare(spare, true).await.map(|machine| ReadyVm {
                    machine,
                    start: Start::Reset,
                    owner,
                })
            }
            // Past `base`, a new process only for a pool that keeps warm forks at all (a
            // pool of none keeps VMs given back, nothing more), and with room for it.
            None if have >= self.size.base && (self.size.base == 0 || !self.has_room()) => return false,
            None => self.make_ready().await.map(|machine| {
                self.started.fetch_add(1, Ordering::Relaxed);
                ReadyVm {
                    machine,
                    start: Start::Fork,
                    owner: None,
                }
            }),
        };
        match made {
            Ok(vm) => locked(&self.ready).push_back(vm),
            Err(e) => {
                tracing::warn!(snapshot = self.snapshot.id(), "warm pool: {e}");
                *locked(&self.last_error) = Some(e.to_string());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        true
    }
}

impl WarmPool {
    /// Starts a pool keeping `size` machines ready for `snapshot`.
    pub fn start(forker: Forker, snapshot: Snapshot, size: usize) -> Result<WarmPool, ForkError> {
        WarmPool::start_with_mode(forker, snapshot, size, PoolMode::Incoming)
    }

    pub fn start_with_mode(
        forker: Forker,
        snapshot: Snapshot,
        size: usize,
        mode: PoolMode,
    ) -> Result<WarmPool, ForkError> {
        let warm_up = WarmUp {
            argv: true,
            ..WarmUp::shell("true")
        };
        WarmPool::start_sized(forker, snapshot, PoolSize::fixed(size), mode, warm_up)
    }

    /// A pool of `size` whose resumed machines run `warm_up` before they wait.
    pub fn start_sized(
        forker: Forker,
        snapshot: Snapshot,
        size: PoolSize,
        mode: PoolMode,
        warm_up: WarmUp,
    ) -> Result<WarmPool, ForkError> {
        snapshot.check_host(&forker.host)?;
        snapshot.check_files()?;
        let inner = Arc::new(PoolInner {
            forker,
            snapshot,
            size,
            mode,
            warm_up,
            ready: Mutex::default(),
            spares: Mutex::default(),
            misses: Mutex::default(),
            wanted: Arc::new(tokio::sync::Notify::new()),
            last_error: Mutex::new(None),
            started: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            reset_failed: AtomicU64::new(0),
            missed: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        let refill = tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                if inner.refill_one().await {
                    continue;
                }
                let wanted = inner.wanted.clone();
                drop(inner);
                let _ = tokio::time::timeout(LOOK_AGAIN, wanted.notified()).await;
            }
        });
        Ok(WarmPool { inner, refill })
    }

    /// Machines ready right now.
    pub fn ready(&self) -> usize {
        locked(&self.inner.ready).len()
    }

    /// What the pool holds and did.
    pub fn counts(&self) -> PoolCounts {
        PoolCounts {
            ready: self.ready(),
            spares: locked(&self.inner.spares).len(),
            target: self.inner.target(),
            started: self.inner.started.load(Ordering::Relaxed),
            reset: self.inner.reset.load(Ordering::Relaxed),
            reset_failed: self.inner.reset_failed.load(Ordering::Relaxed),
            missed: self.inner.missed.load(Ordering::Relaxed),
        }
    }

    /// Waits until the pool holds its target (for benchmarks and tests), or `timeout` passes.
    pub async fn wait_full(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.ready() < self.inner.target() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Process ids of the machines waiting in the pool.
    pub fn ready_pids(&self) -> Vec<u32> {
        locked(&self.inner.ready).iter().map(|r| r.machine.pid()).collect()
    }

    pub fn last_error(&self) -> Option<String> {
        locked(&self.inner.last_error).clone()
    }

    /// A fork with `identity` for anyone: a ready machine made by a new process, else a new
    /// process (a suite's pool, whose VMs nobody gives back).
    pub async fn fork(&self, identity: ForkIdentity) -> Result<Fork, ForkError> {
        self.take(identity, None).await
    }

    /// A fork with `identity` for `owner`: a ready machine (a new process's, or one of the
    /// owner's own VMs reset), else a spare of the owner's resumed now, else a new process. A
    /// reset that fails is said in the fork ([`Start::ResetFailed`]).
    pub async fn fork_for(&self, identity: ForkIdentity, owner: u64) -> Result<Fork, ForkError> {
        self.take(identity, Some(owner)).await
    }

    async fn take(&self, identity: ForkIdentity, owner: Option<u64>) -> Result<Fork, ForkError> {
        let inner = &self.inner;
        let ready = inner.take_ready(owner);
        if ready.is_none() {
            inner.missed.fetch_add(1, Ordering::Relaxed);
            locked(&inner.misses).push_back(Instant::now());
        }
        inner.wanted.notify_one();
        match (ready, inner.mode) {
            (Some(vm), PoolMode::Resumed) => {
                let mut fork = apply_identity(vm.machine, &inner.snapshot, identity).await?;
                fork.start = vm.start;
                Ok(fork)
            }
            (Some(vm), PoolMode::Incoming) => inner.forker.resume(vm.machine, &inner.snapshot, identity).await,
            (None, _) => {
                let mut reset_error = None;
                if let Some(spare) = owner.and_then(|o| inner.take_spare(Some(o))) {
                    match inner.resume_spare(spare, false).await {
                        Ok(machine) => {
                            let mut fork = apply_identity(machine, &inner.snapshot, identity).await?;
                            fork.start = Start::Reset;
                            return Ok(fork);
                        }
                        Err(e) => reset_error = Some(vmm::describe(&e)),
                    }
                }
                let machine = inner.forker.prepare(&inner.snapshot).await?;
                let mut fork = inner.forker.resume(machine, &inner.snapshot, identity).await?;
                if reset_error.is_some() {
                    fork.start = Start::ResetFailed;
                    fork.reset_error = reset_error;
                }
                Ok(fork)
            }
        }
    }

    /// Takes back a fork `owner` is done with, to be reset to the snapshot for a later fork
    /// of the same owner's ([`WarmPool::fork_for`]). Only a live fork of this snapshot that
    /// can be reset in place, started with the pool's own disk limit, is kept, and only while
    /// the pool needs it and the host has room (else its QEMU is killed now). It runs nothing
    /// and reaches nothing until its reset: its process is stopped and its network closed.
    pub fn give_back(&self, mut fork: Fork, owner: u64) {
        let inner = &self.inner;
        let alive = fork.machine.limit_violation().is_none() && fork.machine.exited().is_none();
        let keep = inner.mode == PoolMode::Resumed
            && alive
            && fork.machine.resettable()
            && fork.snapshot_id == inner.snapshot.id()
            && fork.machine.launch_disk_limit() == inner.forker.max_disk_bytes
            && inner.has_room();
        if !keep {
            kill_later(fork.machine);
            return;
        }
        fork.machine.set_network(egress::Policy::default());
        fork.machine.lift_disk_limit();
        fork.machine.freeze();
        let target = inner.target();
        let refused = {
            let ready = locked(&inner.ready);
            let mut spares = locked(&inner.spares);
            if ready.len() + spares.len() <= target {
                spares.push(Spare {
                    machine: fork.machine,
                    clean: false,
                    since: Instant::now(),
                    owner,
                });
                None
            } else {
                Some(fork.machine)
            }
        };
        match refused {
            None => inner.wanted.notify_one(),
            Some(machine) => kill_later(machine),
        }
    }
}

/// Stops a machine off the async runtime (killing a QEMU waits for it to exit).
fn kill_later(machine: Machine) {
    tokio::task::spawn_blocking(move || drop(machine));
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        // Stop refilling; the machines are killed as the pool's state drops (SIGKILL ends
        // a stopped process too).
        self.refill.abort();
    }
}
