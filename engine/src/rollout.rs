//! One rollout, start to end: [`Engine::run_one`] runs it isolated (a panic is its own
//! `env_error`) with retries of the farm's failures, and `Engine::rollout` is its life in
//! one place.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::action::{data_only_rollout, observation, Submitted};
use crate::config::{RolloutsSection, ScoringMode};
use crate::end::{record_verdict, worth_retrying, End, Ending};
use crate::engine::{Engine, Planned, TaskSnapshot};
use crate::environment::Environment;
use crate::live::LiveFork;
use crate::metrics::{self, Role};
use crate::policy::Driver;
use crate::row::{now_ms, Row, Step};

impl Engine {
    /// Runs one rollout on a task of its own, with retries of the farm's failures; a panic
    /// in it becomes an `env_error` row for that rollout instead of ending the caller.
    pub async fn run_one(self: &Arc<Self>, item: Planned) -> Row {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "rollout",
            run_id = %self.run_id,
            task_id = %item.task.id,
            sample = item.sample,
            rollout_id = item.served.as_ref().map(|s| s.rollout_id.as_str()).unwrap_or(""),
            fork_id = tracing::field::Empty,
        );
        metrics::get().in_flight.inc();
        let _in_flight = Defer(|| metrics::get().in_flight.dec());
        let mut inner = {
            let (engine, item) = (self.clone(), item.clone());
            AbortOnDrop(tokio::spawn(
                async move { engine.rollout_with_retries(&item).await }.instrument(span),
            ))
        };
        match (&mut inner.0).await {
            Ok(row) => row,
            Err(e) => self.ended(&item, End::Internal(e.to_string())),
        }
    }

    /// The row of a rollout that ended before it ran (cancelled, lost, failed inside farm).
    pub fn ended(&self, item: &Planned, end: End) -> Row {
        let mut row = self.new_row(item);
        end.settle(&mut row);
        row
    }

    async fn rollout_with_retries(&self, item: &Planned) -> Row {
        let mut attempt = 1;
        loop {
            let (mut row, end) = self.attempt(item).await;
            row.attempts = attempt;
            tracing::info!(
                attempt,
                status = %row.status,
                reward = row.reward,
                error = row.error.as_deref().unwrap_or(""),
                fork_ms = row.timings.fork_ms,
                rollout_ms = row.timings.rollout_ms,
                score_ms = row.timings.score_ms,
                total_ms = row.timings.total_ms,
                "rollout ended"
            );
            if attempt > self.config.rollouts.retries || !worth_retrying(&end, row.steps.len()) {
                return row;
            }
            attempt += 1;
        }
    }

    /// A row for a rollout, before anything happened: status env_error until decided.
    pub(crate) fn new_row(&self, item: &Planned) -> Row {
        let task = &item.task;
        Row {
            run_id: self.run_id.clone(),
            suite_name: self.suite_name.clone(),
            suite_digest: self.suite_digest.clone(),
            task_digest: task.digest(),
            snapshot_id: match &item.snapshot {
                TaskSnapshot::Ready(s) => s.id().to_string(),
                TaskSnapshot::Pending | TaskSnapshot::Failed(_) => String::new(),
            },
            policy_name: item.policy.name().to_string(),
            policy_params: item.policy.params().to_string(),
            started_at_ms: now_ms(),
            rollout_id: item.served.as_ref().map(|s| s.rollout_id.clone()),
            group_id: item.served.as_ref().map(|s| s.group_id.clone()),
            policy_version: item.served.as_ref().and_then(|s| s.policy_version),
            metadata: item.served.as_ref().and_then(|s| s.metadata.clone()),
            ..Row::blank(&task.id, item.sample, item.seed)
        }
    }

    /// One attempt at a rollout, and how it ended.
    async fn attempt(&self, item: &Planned) -> (Row, End) {
        let started = Instant::now();
        let mut row = self.new_row(item);
        let end = self.rollout(item, &mut row, started).await;
        end.settle(&mut row);
        row.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        (row, end)
    }

    /// The life of a rollout: fork → act → collect the artifacts → score where the agent
    /// cannot reach → the verdict into the row. A replay that only writes workspace files
    /// needs no fork: those files are its artifacts.
    async fn rollout(&self, item: &Planned, row: &mut Row, started: Instant) -> End {
        let task = &item.task;
        let limits = &Environment::of(task).limits(&item.limits);
        let snapshot = match &item.snapshot {
            TaskSnapshot::Ready(s) => s.clone(),
            TaskSnapshot::Failed(e) => return End::NoSnapshot(e.clone()),
            TaskSnapshot::Pending => return End::NoSnapshot("the task's snapshot was never prepared".into()),
        };
        let mut driver = match item.policy.driver(task, item.sample, item.seed) {
            Ok(d) => d,
            Err(e) => return End::NoActions(e.to_string()),
        };
        if let Some(end) = self.replay_without_a_vm(item, &snapshot, &driver, row).await {
            return end;
        }
        let live = match self.open(task, &snapshot, item.seed, limits, Role::Rollout).await {
            Ok(live) => live,
            Err(end) => return end,
        };
        row.timings.fork_ms = started.elapsed().as_secs_f64() * 1e3;
        row.note_vm(&live.fork, false);
        let acting = Instant::now();
        let (ending, answer) = self.drive(&live, &mut driver, limits, &mut row.steps).await;
        (row.messages, row.usage) = (driver.messages_json(), driver.usage());
        row.timings.rollout_ms = acting.elapsed().as_secs_f64() * 1e3;
        match ending {
            Ending::Done => self.finish(live, task, &snapshot, answer, row).await,
            Ending::Timeout => End::Timeout(limits.timeout_secs),
            // The model's answer refused by its endpoint: its failure.
            Ending::PolicyRefused(reason) => End::PolicyRefused(reason),
            // The endpoint failed, not the model's answer: an environment error (retried).
            Ending::PolicyFailed(reason) => End::PolicyEndpoint(reason),
            // The agent's own action took its VM down: an agent failure, not the farm's.
            Ending::AgentBrokeVm(reason) => End::AgentBrokeVm(reason),
        }
    }

    /// A replay whose every action writes a workspace file or submits is scored without a
    /// rollout VM (only fresh-fork scoring can use that: final-state scoring grades the
    /// rollout's VM). None when the rollout needs a VM.
    async fn replay_without_a_vm(
        &self,
        item: &Planned,
        snapshot: &snapshotter::Snapshot,
        driver: &Driver<'_>,
        row: &mut Row,
    ) -> Option<End> {
        if self.config.scoring.mode != ScoringMode::FreshFork || !Environment::of(&item.task).scores_files_alone() {
            return None;
        }
        let (steps, artifacts) = data_only_rollout(
            driver.replayed()?,
            item.limits.max_steps,
            &scorers::ArtifactLimits::default(),
        )?;
        row.steps = steps;
        let scoring = Instant::now();
        let (verdict, scoring_vm) = self.score(&item.task, snapshot, None, &artifacts).await;
        if let Some((start, reset_error)) = scoring_vm {
            row.note_start(start, reset_error, true);
        }
        row.timings.score_ms = scoring.elapsed().as_secs_f64() * 1e3;
        Some(record_verdict(row, verdict, &artifacts))
    }

    /// The policy's actions in `live`, until it is done, submits, or a limit or failure
    /// ends the rollout. Steps go into `steps` as they finish.
    pub(crate) async fn drive(
        &self,
        live: &LiveFork,
        driver: &mut Driver<'_>,
        limits: &RolloutsSection,
        steps: &mut Vec<Step>,
    ) -> (Ending, Option<String>) {
        // The time limit counts the agent's actions in the VM, not the time the policy takes
        // to answer (an endpoint's queueing and retries are not the agent's doing; the
        // policy has its own request timeout and retries).
        let mut observed = None;
        let budget = Duration::from_secs(limits.timeout_secs);
        let mut spent = Duration::ZERO;
        for index in 0..limits.max_steps {
            let action = match driver.next(observed.take()).await {
                Ok(Some(action)) => action,
                Ok(None) => break,
                Err(e) => return (e.into(), None),
            };
            let started = Instant::now();
            let Some(remaining) = budget.checked_sub(spent) else {
                return (Ending::Timeout, None);
            };
            let result = match tokio::time::timeout(remaining, self.act(live, &action, index as u32, limits)).await {
                Ok(result) => result,
                Err(_) => return (Ending::Timeout, None),
            };
            spent += started.elapsed();
            match result {
                Ok((step, submitted)) => {
                    observed = Some(observation(&step));
                    steps.push(step);
                    if let Submitted::Yes(answer) = submitted {
                        return (Ending::Done, answer);
                    }
                }
                Err((step, reason)) => {
                    steps.push(step);
                    return (Ending::AgentBrokeVm(reason), None);
                }
            }
        }
        (Ending::Done, None)
    }
}

/// Runs a closure when dropped.
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Aborts a spawned task when dropped (an interrupted run must not leave rollouts running).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
