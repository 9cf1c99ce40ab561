//! The service's calls on events, as a caller makes them: a fork named in a filter must be
//! the caller's.

use tokio::sync::mpsc;

use super::{EventList, EventView, MAX_LIST};
use crate::error::{ApiError, ApiResult, ErrorKind};

impl crate::state::Service {
    /// The fork an events filter names, if the caller owns it (a sandbox or a session, live
    /// or gone); another tenant's is the same 404 as none.
    fn events_fork(&self, who: &crate::tenancy::Who, id: Option<&str>) -> ApiResult<Option<String>> {
        let Some(id) = id else { return Ok(None) };
        crate::bounds::text("sandbox", id, crate::bounds::ID_BYTES)?;
        let mine = [tenants::Kind::Sandbox, tenants::Kind::Session]
            .into_iter()
            .any(|kind| self.tenancy.owns(who.tenant(), kind, id));
        match mine {
            true => Ok(Some(id.to_string())),
            false => Err(ApiError::field(
                ErrorKind::NotFound,
                "sandbox",
                format!("no sandbox or session {id:?}"),
            )),
        }
    }

    /// `GET /v1/events`: the caller's events after `after`, of one fork when named.
    pub fn list_events(
        &self,
        who: &crate::tenancy::Who,
        after: u64,
        fork: Option<&str>,
        limit: Option<u64>,
    ) -> ApiResult<EventList> {
        let limit = limit.unwrap_or(100);
        crate::bounds::range("limit", limit, (1, MAX_LIST as u64), "events")?;
        let fork = self.events_fork(who, fork)?;
        self.events.list(who.tenant(), after, fork.as_deref(), limit as usize)
    }

    /// `GET /v1/events/stream`: the caller's events after `after` as they happen.
    pub fn follow_events(
        &self,
        who: &crate::tenancy::Who,
        after: u64,
        fork: Option<&str>,
    ) -> ApiResult<mpsc::Receiver<EventView>> {
        let fork = self.events_fork(who, fork)?;
        Ok(self.events.follow(who.tenant(), after, fork))
    }
}
