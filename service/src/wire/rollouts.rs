//! Answers about rollouts: submits, one rollout, cancels, the service's capacity.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::entries::Phase;

/// `POST /v1/rollouts` (202): the groups admitted, one per item. Also what `requests.jsonl`
/// records for an idempotency key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    pub groups: Vec<Group>,
}

/// One item's rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Group {
    pub group_id: String,
    pub task_id: String,
    pub suite: String,
    pub rollout_ids: Vec<String>,
}

/// `GET /v1/rollouts/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RolloutView {
    pub rollout_id: String,
    pub group_id: String,
    pub policy_version: Option<u64>,
    pub state: Phase,
    /// Its row's cursor in `GET /v1/results`, once done.
    pub cursor: Option<usize>,
    /// Its row, once done (the columns of the Parquet schema).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub row: Option<serde_json::Value>,
}

/// `POST /v1/rollouts/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Cancelled {
    pub rollout_id: String,
    pub cancelled: bool,
    pub state: Phase,
}

/// `POST /v1/cancel`: how many queued or running rollouts were cancelled.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CancelledCount {
    pub cancelled: usize,
}

/// `GET /v1/capacity`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Capacity {
    /// Rollouts at once.
    pub slots: usize,
    pub in_flight: usize,
    pub queued: usize,
    /// Warm forks ready.
    pub warm: usize,
    pub queue_limit: usize,
    /// Live sessions and sandboxes (with a VM).
    pub sessions: usize,
    pub sandboxes: usize,
    pub max_sessions: usize,
    pub memory: MemoryCapacity,
}

/// The memory part of the capacity: what one more VM costs, and how many more fit.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MemoryCapacity {
    pub available_mib: u64,
    pub reserve_mib: u64,
    pub vm_cost_mib: u64,
    /// VMs the cost is measured on (0: farm's estimate).
    pub vm_cost_sampled: usize,
    pub more_vms: u64,
}
