//! A restart of `farm serve`: what the previous process admitted is taken up. Rows stay
//! served from their cursors, paused sessions are taken up again, and admitted work without a
//! row gets an `env_error` row "lost in restart".

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use engine::row::{now_ms, Row};
use engine::End;

use super::entries::{Entry, Phase};
use super::requests::{Admitted, Record};
use crate::state::Service;

/// What became of admitted work that has no row.
enum TakenUp {
    /// A paused session, live again in the book.
    Session,
    /// Recorded lost, at this cursor.
    Lost(usize),
}

impl Service {
    /// Takes up what a previous process admitted: rows stay where they are; admitted work
    /// without a row gets an `env_error` row "lost in restart".
    pub async fn restore(&self, records: Vec<Record>, done: &HashMap<String, usize>) -> Result<()> {
        let ended = ended_sessions(&records);
        // Each session's last pause or resume: paused sessions are taken up, not lost.
        let paused_dirs = paused_dirs(&records);
        let mut kept_dirs = HashSet::new();
        let (mut lost, mut taken_up) = (0, 0);
        for record in records {
            let (admitted, closed, session) = match record {
                Record::Submit {
                    idempotency_key,
                    body_digest,
                    response,
                    rollouts,
                } => {
                    if let Some(key) = idempotency_key {
                        self.lock().idempotency.restore(key, body_digest, response);
                    }
                    (rollouts, false, None)
                }
                Record::Session { session_id, rollout } => {
                    let closed = ended.contains(&session_id);
                    (vec![rollout], closed, Some(session_id))
                }
                Record::SessionEnd { .. } | Record::SessionPaused { .. } | Record::SessionResumed { .. } => continue,
            };
            for a in admitted {
                let paused_dir = match (&session, closed) {
                    (Some(id), false) => paused_dirs.get(id).cloned().flatten(),
                    _ => None,
                };
                let (cursor, phase) = match (done.get(&a.rollout_id).copied(), closed) {
                    (Some(c), _) => (Some(c), Phase::Done),
                    // A session ended without a row (deleted or expired).
                    (None, true) => (None, Phase::Done),
                    (None, false) => match self.take_up_or_lose(&a, paused_dir.as_deref()).await? {
                        TakenUp::Session => {
                            kept_dirs.extend(paused_dir);
                            taken_up += 1;
                            (None, Phase::Session)
                        }
                        TakenUp::Lost(cursor) => {
                            lost += 1;
                            (Some(cursor), Phase::Done)
                        }
                    },
                };
                let entry = Entry {
                    cursor,
                    ..Entry::new(&a, if phase == Phase::Session { session.clone() } else { None }, phase)
                };
                self.lock().rollouts.insert(a.rollout_id.clone(), entry);
            }
        }
        self.remove_unpaused_folders(&kept_dirs);
        if lost > 0 {
            tracing::info!(
                "{lost} rollouts or sessions of the previous process were lost in its restart (recorded as env_error)"
            );
        }
        if taken_up > 0 {
            tracing::info!("{taken_up} paused sessions taken up");
        }
        self.update_session_gauges();
        Ok(self.recorder.flush().await?)
    }

    /// Removes the folders of sessions that are not paused any more (resumed, ended, or a
    /// pause that was never recorded): all but `kept_dirs`.
    fn remove_unpaused_folders(&self, kept_dirs: &HashSet<String>) {
        if let Ok(entries) = std::fs::read_dir(self.paused_root()) {
            for entry in entries.flatten() {
                if !kept_dirs.contains(&entry.file_name().to_string_lossy().to_string()) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }

    /// A session paused in `paused_dir` is taken up; anything else admitted without a row is
    /// recorded lost (saying why its paused state could not be taken up, if it had one).
    async fn take_up_or_lose(&self, a: &Admitted, paused_dir: Option<&str>) -> Result<TakenUp> {
        let mut reason = None;
        if let Some(dir) = paused_dir {
            match self.take_up_paused(&self.paused_root().join(dir)).await {
                Ok((id, s)) => {
                    let timers = self.session_timers();
                    // Its owner as the tenants database has it (one of before tenants is
                    // adopted as the default tenant's).
                    let card = crate::entries::Card {
                        owner: self
                            .tenancy
                            .owners
                            .of(tenants::Kind::Session, &id)
                            .first()
                            .map_or(tenants::DEFAULT, |o| o.tenant),
                        memory_mib: self.session_mib(),
                        environment: None,
                        ports: Default::default(),
                    };
                    self.forks().add_paused(
                        &id,
                        engine::book::Kind::Session,
                        s,
                        card,
                        timers,
                        std::time::Instant::now(),
                    );
                    return Ok(TakenUp::Session);
                }
                Err(e) => reason = Some(engine::describe(&e)),
            }
        }
        let mut row = lost_row(a, &self.run_id);
        if let Some(reason) = reason {
            row.error = Some(format!(
                "lost in restart: its paused state could not be taken up: {reason}"
            ));
        }
        Ok(TakenUp::Lost(self.recorder.append(row).await?))
    }
}

/// The sessions the records say ended.
fn ended_sessions(records: &[Record]) -> HashSet<String> {
    records
        .iter()
        .filter_map(|r| {
            if let Record::SessionEnd { session_id, .. } = r {
                Some(session_id.clone())
            } else {
                None
            }
        })
        .collect()
}

/// Each session's folder as its last pause or resume left it: the folder while paused, None
/// once resumed.
fn paused_dirs(records: &[Record]) -> HashMap<String, Option<String>> {
    let mut paused_dirs: HashMap<String, Option<String>> = HashMap::new();
    for r in records {
        match r {
            Record::SessionPaused { session_id, dir } => {
                paused_dirs.insert(session_id.clone(), Some(dir.clone()));
            }
            Record::SessionResumed { session_id } => {
                paused_dirs.insert(session_id.clone(), None);
            }
            _ => {}
        }
    }
    paused_dirs
}

/// The `env_error` row of a rollout a previous process admitted and never finished.
fn lost_row(a: &Admitted, run_id: &str) -> Row {
    let mut row = Row {
        run_id: run_id.to_string(),
        suite_name: a.suite.clone(),
        policy_name: a.policy_name.clone(),
        attempts: 0,
        started_at_ms: now_ms(),
        rollout_id: Some(a.rollout_id.clone()),
        group_id: Some(a.group_id.clone()),
        policy_version: a.policy_version,
        metadata: a.metadata.clone(),
        ..Row::blank(&a.task_id, a.sample, a.seed)
    };
    End::LostInRestart.settle(&mut row);
    row
}
