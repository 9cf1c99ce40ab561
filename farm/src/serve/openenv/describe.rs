//! What OpenEnv's clients ask of the environment before an episode: its health, its
//! metadata (farm's suites and tasks) and the JSON Schemas of its messages.

use serde_json::{json, Value};

use crate::serve::http::{ok, App, Reply};
use axum::extract::State;

/// `GET /v1/openenv/health`.
pub(in crate::serve) async fn health() -> Reply {
    ok(json!({ "status": "healthy" }))
}

/// `GET /v1/openenv/schema`.
pub(in crate::serve) async fn schema_route() -> Reply {
    ok(schema())
}

pub(in crate::serve) async fn metadata(State(app): State<App>) -> Reply {
    let mut suites: Vec<Value> = app
        .service
        .suites
        .iter()
        .map(|(name, state)| {
            let mut tasks: Vec<&String> = state.tasks.keys().collect();
            tasks.sort();
            json!({ "name": name, "tasks": tasks })
        })
        .collect();
    suites.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    ok(json!({
        "name": "farm",
        "description": "Tasks served by farm: each connection is a fork of a task's snapshotted microVM; actions are shell commands, file writes and a submit scored where the agent cannot reach.",
        "version": env!("CARGO_PKG_VERSION"),
        "readme_content": null,
        "author": null,
        "documentation_url": null,
        "suites": suites,
    }))
}

/// JSON Schemas of the actions, observations, state and reset's arguments.
fn schema() -> Value {
    json!({
        "action": {
            "title": "FarmAction",
            "oneOf": [
                { "type": "object", "additionalProperties": false, "required": ["kind", "command"], "properties": {
                    "kind": { "const": "exec" }, "command": { "type": "string" },
                    "timeout_secs": { "type": "integer", "minimum": 1 } } },
                { "type": "object", "additionalProperties": false, "required": ["kind", "path", "content"], "properties": {
                    "kind": { "const": "write_file" }, "path": { "type": "string" }, "content": { "type": "string" },
                    "mode": { "type": "integer", "minimum": 0, "maximum": 4095 } } },
                { "type": "object", "additionalProperties": false, "required": ["kind"], "properties": {
                    "kind": { "const": "submit" }, "answer": { "type": ["string", "null"] } } },
            ],
        },
        "observation": {
            "title": "FarmObservation", "type": "object", "properties": {
                "text": { "type": "string", "description": "What a model reads: the instruction after reset, the step's output after a step." },
                "instruction": { "type": "string" }, "task_id": { "type": "string" },
                "exit_code": { "type": ["integer", "null"] }, "stdout": { "type": "string" }, "stderr": { "type": "string" },
                "status": { "type": "string", "description": "At the end: passed, failed, timeout or env_error." },
                "trust": { "type": "string" }, "error": { "type": ["string", "null"] },
            },
        },
        "state": {
            "title": "FarmState", "type": "object", "properties": {
                "episode_id": { "type": ["string", "null"] }, "session_id": { "type": ["string", "null"] },
                "rollout_id": { "type": ["string", "null"] }, "task_id": { "type": ["string", "null"] },
                "step_count": { "type": "integer" }, "done": { "type": "boolean" },
            },
        },
        "reset": {
            "title": "FarmReset", "type": "object", "additionalProperties": false, "properties": {
                "suite": { "type": "string" }, "task_id": { "type": "string", "description": "Default: the suite's tasks in turn." },
                "seed": { "type": "integer", "minimum": 0 }, "episode_id": { "type": "string" },
                "branch_of": { "type": "string", "description": "A live session's id: continue from its state exactly (a GRPO group from one prepared state)." },
                "limits": { "type": "object" }, "policy_version": { "type": "integer" }, "metadata": { "type": "object" },
            },
        },
    })
}
