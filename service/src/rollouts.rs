//! Submitted rollouts: admission (`POST /v1/rollouts`), results (`GET /v1/results`), one
//! rollout's state, and cancellation.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use engine::config::PolicyOrigin;
use engine::{rollout_seed, End, Planned, Policy, Served, TaskSnapshot};

use super::entries::{Entry, Phase};
use super::requests::{metadata_text, Admitted, Record, SubmitRequest};
use super::tenancy::Who;
use super::wire::{Cancelled, CancelledCount, Group, RolloutView, Submitted};
use crate::error::ErrorKind;
use crate::state::{suite_of, ApiError, ApiResult, Queued, Service};
use engine::idempotency::Claim;

/// Bytes of rows one `/v1/results` answer carries at most (at least one row).
const RESULTS_MAX_BYTES: u64 = 64 << 20;

/// Rows of other tenants one `/v1/results` request reads, at most, looking for the caller's.
const RESULTS_SCAN: usize = 20_000;

impl Service {
    /// `POST /v1/rollouts`.
    pub async fn submit(
        &self,
        request: SubmitRequest,
        idempotency_key: Option<String>,
        body_digest: String,
        who: &Who,
    ) -> ApiResult<serde_json::Value> {
        self.check_admitting()?;
        if let Some(answer) = self.answered_before(idempotency_key.as_deref(), &body_digest)? {
            return Ok(answer);
        }
        if request.items.is_empty() {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "items",
                "must hold at least one item",
            ));
        }
        super::bounds::count("items", request.items.len(), super::bounds::SUBMIT_ITEMS, "items")?;
        let (planned, admitted, response) = self.plan_items(&request).await?;
        // Admission: room in the queue and the key, taken under the lock; the journal line is
        // written without it; then the rollouts are queued.
        if let Some(answer) = self.reserve_admission(idempotency_key.as_deref(), &body_digest, planned.len(), who)? {
            return Ok(answer);
        }
        // The caller's before any can finish: its rows are never skipped as another's.
        let ids: Vec<String> = planned
            .iter()
            .filter_map(|p| p.served.as_ref().map(|s| s.rollout_id.clone()))
            .collect();
        if let Err(e) = self.tenancy.own(who.tenant(), tenants::Kind::Rollout, &ids) {
            self.lock().admitting -= planned.len();
            if let Some(key) = &idempotency_key {
                self.lock().idempotency.settle(key, &body_digest, None);
            }
            return Err(e);
        }
        // Journaled before it is admitted or answered: a crash after this line reports these
        // rollouts as lost, never forgets them.
        let record = Record::Submit {
            idempotency_key: idempotency_key.clone(),
            body_digest: body_digest.clone(),
            response: response.clone(),
            rollouts: admitted,
        };
        let journaled = self.recorder.journal_request(&record).await;
        let cancelled = self.admit(planned, (idempotency_key, body_digest), &response, journaled, who)?;
        // A shutdown that began while the line was written did not see these: they are
        // recorded as cancelled, as it would have.
        for item in cancelled {
            let engine = &self.suites[suite_of(&item)].engine;
            self.emit(engine.ended(&item, End::Cancelled("the service shut down".into())))
                .await;
        }
        self.wake.notify_one();
        Ok(response)
    }

    /// Takes room in the queue for `count` rollouts, and the idempotency key, under the lock;
    /// Some: the answer a retry with the same key got while this one prepared.
    fn reserve_admission(
        &self,
        idempotency_key: Option<&str>,
        body_digest: &str,
        count: usize,
        who: &Who,
    ) -> ApiResult<Option<serde_json::Value>> {
        let mut inner = self.lock();
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::new(ErrorKind::Unavailable, "the service is shutting down"));
        }
        if let Some(key) = idempotency_key {
            // A retry with the same key may have been admitted while this one prepared.
            match inner.idempotency.claim(key, body_digest).map_err(ApiError::from)? {
                Claim::Answered(answer) => return Ok(Some(answer)),
                Claim::Claimed => {}
            }
        }
        let waiting = inner.queue.len() + inner.admitting;
        // A full queue still takes a tenant's work up to its weighted share of the queue, so
        // one tenant's flood cannot keep another's out.
        let share = self.settings.queue_limit * who.profile.tenant.weight as usize
            / inner
                .queue
                .active_weight(who.tenant(), who.profile.tenant.weight)
                .max(1) as usize;
        let room = self
            .settings
            .queue_limit
            .saturating_sub(waiting)
            .max(share.saturating_sub(inner.queue.len_of(who.tenant())));
        if count > room {
            if let Some(key) = idempotency_key {
                inner.idempotency.settle(key, body_digest, None);
            }
            let per_slot = waiting / self.slots.max(1);
            return Err(ApiError {
                retry_after: Some((per_slot as u64).clamp(1, 60)),
                ..ApiError::new(
                    ErrorKind::Busy,
                    format!(
                        "the queue holds {waiting} rollouts (serve.queue_limit {}); {} more do not fit: retry later",
                        self.settings.queue_limit, count
                    ),
                )
            });
        }
        inner.admitting += count;
        Ok(None)
    }

    /// After the journal line (`journaled`): gives back the reservation and, when the line was
    /// written, keeps the answer for the key and queues the rollouts; returns those a
    /// shutdown under way cancels instead.
    fn admit(
        &self,
        planned: Vec<Planned>,
        (idempotency_key, body_digest): (Option<String>, String),
        response: &serde_json::Value,
        journaled: Result<(), engine::recorder::OutputError>,
        who: &Who,
    ) -> ApiResult<Vec<Planned>> {
        let mut inner = self.lock();
        inner.admitting -= planned.len();
        let answer = journaled.is_ok().then(|| response.clone());
        if let Some(key) = &idempotency_key {
            inner.idempotency.settle(key, &body_digest, answer);
        }
        journaled.map_err(|e| ApiError::new(ErrorKind::Internal, format!("journaling the request: {e}")))?;
        let stopping = self.stopping.load(Ordering::SeqCst);
        let mut cancelled = Vec::new();
        for p in planned {
            let s = p.served.as_ref().expect("served");
            inner.rollouts.insert(
                s.rollout_id.clone(),
                Entry {
                    session: None,
                    group_id: s.group_id.clone(),
                    policy_version: s.policy_version,
                    phase: Phase::Queued,
                    cursor: None,
                    recording: false,
                },
            );
            if stopping {
                cancelled.push(p);
            } else {
                let queued = Queued {
                    item: p,
                    since: std::time::Instant::now(),
                    tenant_name: who.profile.tenant.name.clone(),
                };
                inner.queue.push(who.tenant(), who.profile.tenant.weight, queued);
            }
        }
        engine::metrics::get().queue_depth.set(inner.queue.len() as i64);
        Ok(cancelled)
    }

    /// The answer a request with this key already got, if any.
    fn answered_before(&self, key: Option<&str>, body_digest: &str) -> ApiResult<Option<serde_json::Value>> {
        let Some(key) = key else { return Ok(None) };
        self.lock()
            .idempotency
            .answered(key, body_digest)
            .map_err(ApiError::from)
    }

    /// Each item's rollouts: the task (an inline one gets its snapshot), the policy over the
    /// suite's, the limits, ids and seeds.
    async fn plan_items(&self, request: &SubmitRequest) -> ApiResult<(Vec<Planned>, Vec<Admitted>, serde_json::Value)> {
        let (mut planned, mut admitted, mut groups) = (Vec::new(), Vec::new(), Vec::new());
        for (i, item) in request.items.iter().enumerate() {
            let at = |f: &str| format!("items[{i}].{f}");
            item.check_bounds(&at)?;
            if !item.workspaces.is_empty() {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    at("workspaces"),
                    "rollouts start from their task alone: open a session to start from a workspace",
                ));
            }
            let (suite_name, state) = self.suite(item.suite.as_deref(), &at("suite"))?;
            let n = item.n.unwrap_or(1);
            if n == 0 || n > self.settings.max_samples_per_item {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    at("n"),
                    format!(
                        "must be 1 to {} (serve.max_samples_per_item)",
                        self.settings.max_samples_per_item
                    ),
                ));
            }
            let metadata = metadata_text(item.metadata.as_ref(), &at("metadata"))?;
            let (task, snapshot) = self
                .resolve_task(state, item.task_id.as_deref(), item.task.as_ref(), &at)
                .await?;
            let policy = item_policy(state, item, &at)?;
            let limits = item.limits.apply(&state.engine.config.rollouts, &at)?;
            let group_id = self.new_id("g");
            let mut ids = Vec::new();
            for sample in 0..n {
                let rollout_id = self.new_id("r");
                let seed = rollout_seed(item.seed, &task.id, sample);
                let served = Served {
                    suite: suite_name.to_string(),
                    rollout_id: rollout_id.clone(),
                    group_id: group_id.clone(),
                    policy_version: item.policy_version,
                    metadata: metadata.clone(),
                };
                admitted.push(Admitted {
                    rollout_id: rollout_id.clone(),
                    group_id: group_id.clone(),
                    suite: suite_name.to_string(),
                    task_id: task.id.clone(),
                    sample,
                    seed,
                    policy_version: item.policy_version,
                    policy_name: policy.name().to_string(),
                    metadata: metadata.clone(),
                });
                let snapshot = TaskSnapshot::Ready(snapshot.clone());
                planned.push(Planned {
                    task: task.clone(),
                    sample,
                    seed,
                    snapshot,
                    policy: policy.clone(),
                    limits: limits.clone(),
                    served: Some(served),
                });
                ids.push(rollout_id);
            }
            groups.push(Group {
                group_id,
                task_id: task.id.clone(),
                suite: suite_name.to_string(),
                rollout_ids: ids,
            });
        }
        let submitted = serde_json::to_value(Submitted { groups }).expect("answers serialize");
        Ok((planned, admitted, submitted))
    }

    /// `GET /v1/results`: rows from `cursor`, waiting up to `wait` for the first.
    /// `GET /v1/results`: the caller's rows from `cursor` on (each with its cursor), and the
    /// cursor to ask from next (past rows of other tenants too).
    pub async fn results(
        &self,
        cursor: usize,
        max: usize,
        wait: Duration,
        who: &Who,
    ) -> ApiResult<(Vec<(usize, Vec<u8>)>, usize)> {
        let mut rows = self.recorder.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        let (mut cursor, mut scanned) = (cursor, 0);
        loop {
            while *rows.borrow_and_update() <= cursor {
                if tokio::time::timeout_at(deadline, rows.changed()).await.is_err() {
                    break;
                }
            }
            let lines = self
                .recorder
                .read_lines(cursor, max, RESULTS_MAX_BYTES)
                .await
                .map_err(|e| ApiError::new(ErrorKind::Internal, format!("reading the journal: {e}")))?;
            let next = cursor + lines.len();
            scanned += lines.len();
            let own = self.own_rows(who, cursor, lines);
            // Only other tenants' rows came: wait on for the caller's own (when it asked to
            // wait), so that when a wait ends says nothing of others' work; a request reads
            // at most RESULTS_SCAN rows of others', then answers with where to go on from.
            let done = !own.is_empty() || next == cursor || scanned >= RESULTS_SCAN;
            if done || tokio::time::Instant::now() >= deadline {
                return Ok((own, next));
            }
            cursor = next;
        }
    }

    /// The rows of `lines` (from `cursor` on) the caller may see, each with its cursor.
    fn own_rows(&self, who: &Who, cursor: usize, lines: Vec<Vec<u8>>) -> Vec<(usize, Vec<u8>)> {
        #[derive(serde::Deserialize)]
        struct Id {
            rollout_id: Option<String>,
        }
        lines
            .into_iter()
            .enumerate()
            .filter(|(_, line)| {
                let id = serde_json::from_slice::<Id>(line).ok().and_then(|r| r.rollout_id);
                self.tenancy
                    .sees(who, tenants::Kind::Rollout, id.as_deref().unwrap_or(""))
            })
            .map(|(i, line)| (cursor + i, line))
            .collect()
    }

    /// `GET /v1/rollouts/{id}`: one of the caller's; another's, or one that never was, is
    /// the same 404.
    pub async fn rollout(&self, who: &Who, id: &str) -> ApiResult<RolloutView> {
        self.own_rollout(who, id)?;
        let entry = self
            .lock()
            .rollouts
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no rollout {id:?}")))?;
        let mut out = RolloutView {
            rollout_id: id.to_string(),
            group_id: entry.group_id.clone(),
            policy_version: entry.policy_version,
            state: entry.phase,
            cursor: entry.cursor,
            row: None,
        };
        if let Some(cursor) = entry.cursor {
            let line = self
                .recorder
                .read_lines(cursor, 1, u64::MAX)
                .await
                .map_err(|e| ApiError::new(ErrorKind::Internal, format!("reading the journal: {e}")))?;
            if let Some(line) = line.first() {
                out.row = serde_json::from_slice(line).ok();
            }
        }
        Ok(out)
    }

    /// Cancels queued or running rollouts: each gets an `env_error` row saying why.
    pub async fn cancel_ids(&self, ids: &[String], why: &str) -> usize {
        let mut cancelled = Vec::new();
        {
            let mut inner = self.lock();
            let queued: std::collections::HashSet<&str> = ids
                .iter()
                .filter(|id| inner.rollouts.get(*id).is_some_and(|e| e.phase == Phase::Queued))
                .map(String::as_str)
                .collect();
            if !queued.is_empty() {
                let taken = inner.queue.extract(|q| {
                    q.item
                        .served
                        .as_ref()
                        .is_some_and(|s| queued.contains(s.rollout_id.as_str()))
                });
                cancelled.extend(taken.into_iter().map(|q| q.item));
            }
            for id in ids {
                let Some(entry) = inner.rollouts.get(id) else { continue };
                match entry.phase {
                    Phase::Queued => {}
                    Phase::Running => {
                        if let Some((handle, item)) = inner.running.remove(id) {
                            // The rollout's VMs are killed as its task is dropped.
                            handle.abort();
                            cancelled.push(item);
                        }
                    }
                    Phase::Session | Phase::Done => {}
                }
            }
        }
        let mut n = 0;
        for item in cancelled {
            let engine = &self.suites[suite_of(&item)].engine;
            // None: the rollout's own row came first; it was not cancelled after all.
            if self
                .emit(engine.ended(&item, End::Cancelled(why.into())))
                .await
                .is_some()
            {
                n += 1;
            }
        }
        self.wake.notify_one();
        n
    }

    /// Ok when rollout `id` is the caller's.
    fn own_rollout(&self, who: &Who, id: &str) -> ApiResult<()> {
        match self.tenancy.owns(who.tenant(), tenants::Kind::Rollout, id) {
            true => Ok(()),
            false => Err(crate::tenancy::not_found(tenants::Kind::Rollout, id)),
        }
    }

    /// `POST /v1/rollouts/{id}/cancel`: one of the caller's.
    pub async fn cancel(&self, who: &Who, id: &str) -> ApiResult<Cancelled> {
        self.own_rollout(who, id)?;
        let phase = self
            .lock()
            .rollouts
            .get(id)
            .map(|e| e.phase)
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no rollout {id:?}")))?;
        if phase == Phase::Session {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("rollout {id:?} is a live session: DELETE /v1/sessions/{{id}} ends it"),
            ));
        }
        let n = self.cancel_ids(&[id.to_string()], "by request").await;
        Ok(Cancelled {
            rollout_id: id.to_string(),
            cancelled: n == 1,
            state: if n == 1 { Phase::Done } else { phase },
        })
    }

    /// `POST /v1/cancel {"policy_version_below": V}`.
    pub async fn cancel_below(&self, version: u64, who: &Who) -> CancelledCount {
        let ids: Vec<String> = self
            .lock()
            .rollouts
            .iter()
            .filter(|(id, e)| {
                matches!(e.phase, Phase::Queued | Phase::Running)
                    && e.policy_version.is_some_and(|v| v < version)
                    && self.tenancy.sees(who, tenants::Kind::Rollout, id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let n = self.cancel_ids(&ids, &format!("policy_version below {version}")).await;
        CancelledCount { cancelled: n }
    }
}

/// An item's policy: its keys over its suite's `[policy]`.
fn item_policy(
    state: &crate::state::SuiteState,
    item: &super::requests::ItemRequest,
    at: &dyn Fn(&str) -> String,
) -> ApiResult<Arc<Policy>> {
    let asked = item.policy.as_ref().ok_or_else(|| {
        ApiError::field(
            ErrorKind::Invalid,
            at("policy"),
            "missing: the policy that acts (its keys override the suite's [policy])",
        )
    })?;
    let config = state
        .suite
        .config
        .policy
        .for_request(asked)
        .map_err(|e| ApiError::field(ErrorKind::Invalid, at(&format!("policy.{}", e.key)), e.message))?;
    let policy = Policy::build(&state.suite, &config, PolicyOrigin::Request)
        .map_err(|e| ApiError::field(ErrorKind::Invalid, at("policy"), e.to_string()))?;
    Ok(Arc::new(policy))
}
