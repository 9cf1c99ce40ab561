//! The sessions an OpenEnv reset opens: a new one of a task, or a branch of a live one.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

use super::{to_value, Failure, Reset};
use crate::serve::http::App;
use crate::serve::tenancy::Who;
use service::requests::{ItemRequest, LimitsRequest};
use service::sessions::SessionId;

/// A branch of `parent`, which continues as it is: a reset that also names a task, a seed,
/// limits, a policy version or metadata is refused.
pub(super) async fn open_branch(
    app: &App,
    who: &Who,
    parent: &str,
    reset: &Reset,
) -> Result<(SessionId, Value), Failure> {
    let given = [
        ("suite", reset.suite.is_some()),
        ("task_id", reset.task_id.is_some()),
        ("seed", reset.seed.is_some()),
        ("limits", reset.limits != LimitsRequest::default()),
        ("policy_version", reset.policy_version.is_some()),
        ("metadata", reset.metadata.is_some()),
    ];
    if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
        return Err(Failure::new(
            "VALIDATION_ERROR",
            format!(
                "{name}: branch_of continues a session as it is (its task, seed, limits, policy_version and metadata)"
            ),
        ));
    }
    let service = &app.service;
    // Another tenant's session is one that does not exist (the service's own check).
    let parent = service.resolve_session(who, parent)?;
    let (id, branched) = service.branch(who, &parent).await?;
    Ok((id, to_value(branched)))
}

/// The request for a new session of the reset's task, or else of the suite's tasks in
/// turn, checked as far as it can be before the connection's session ends (suite, task,
/// request bounds); the episode id, if given, goes in its metadata.
pub(super) fn session_request(app: &App, next_task: &AtomicUsize, reset: Reset) -> Result<ItemRequest, Failure> {
    let service = &app.service;
    let (_, suite) = service.suite(reset.suite.as_deref(), "suite")?;
    let task_id = match reset.task_id {
        Some(t) if suite.tasks.contains_key(&t) => t,
        Some(t) => {
            return Err(Failure::new(
                "VALIDATION_ERROR",
                format!("task_id: the suite serves no task {t:?}"),
            ))
        }
        None => {
            let mut ids: Vec<&String> = suite.tasks.keys().collect();
            ids.sort();
            if ids.is_empty() {
                return Err(Failure::new(
                    "VALIDATION_ERROR",
                    "the suite serves no task: give task_id",
                ));
            }
            ids[next_task.fetch_add(1, Ordering::Relaxed) % ids.len()].clone()
        }
    };
    let mut metadata = reset.metadata;
    if let Some(e) = &reset.episode_id {
        let m = metadata.get_or_insert_with(|| json!({}));
        if let Some(m) = m.as_object_mut() {
            m.insert("episode_id".into(), json!(e));
        }
    }
    let request = ItemRequest {
        suite: reset.suite,
        task_id: Some(task_id),
        task: None,
        n: None,
        seed: reset.seed.unwrap_or(0),
        policy: None,
        policy_version: reset.policy_version,
        limits: reset.limits,
        metadata,
        workspaces: Vec::new(),
    };
    request.check_session()?;
    request.check_bounds(&|f: &str| f.to_string())?;
    Ok(request)
}

/// Opens the session `session_request` checked.
pub(super) async fn open_session(app: &App, who: &Who, request: ItemRequest) -> Result<(SessionId, Value), Failure> {
    let (id, opened) = app.service.open_session(who, request).await?;
    Ok((id, to_value(opened)))
}
