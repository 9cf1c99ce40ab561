//! What a service held before it had tenants is the `default` tenant's: at every start, each
//! id the service holds that nobody owns (rollouts and their sessions, live and paused
//! sessions and sandboxes, environments, build contexts) is recorded as `default`'s. An id
//! nobody owns is then one that does not exist, for every tenant alike.

use tenants::Kind;

use crate::state::Service;

impl Service {
    /// Records every id the service holds and nobody owns as the `default` tenant's.
    pub fn adopt_unowned(&self) -> anyhow::Result<()> {
        let mut held: Vec<(Kind, String)> = Vec::new();
        {
            let inner = self.lock();
            for (id, entry) in &inner.rollouts {
                held.push((Kind::Rollout, id.clone()));
                if let Some(session) = &entry.session {
                    held.push((Kind::Session, session.clone()));
                }
            }
        }
        {
            let book = self.forks();
            for (book_kind, kind) in [
                (engine::book::Kind::Session, Kind::Session),
                (engine::book::Kind::Sandbox, Kind::Sandbox),
            ] {
                held.extend(book.all(book_kind).into_iter().map(|(id, _)| (kind, id)));
            }
        }
        if let Some(api) = &self.sandbox {
            held.extend(api.environments.list().into_iter().map(|e| (Kind::Environment, e.id)));
            held.extend(
                api.environments
                    .contexts
                    .ids()
                    .into_iter()
                    .map(|id| (Kind::Context, id)),
            );
        }
        let tenancy = &self.tenancy;
        for kind in Kind::ALL {
            let ids: Vec<String> = held
                .iter()
                .filter(|(k, id)| *k == kind && tenancy.owners.of(kind, id).is_empty())
                .map(|(_, id)| id.clone())
                .collect();
            if !ids.is_empty() {
                tracing::info!(
                    "tenants: {} {}s from before tenants are the default tenant's",
                    ids.len(),
                    kind.as_str()
                );
                // Visible at once (1: not the 0 that means "after a build's time").
                tenancy.owners.own(&tenancy.db, kind, &ids, tenants::DEFAULT, 0, 1)?;
            }
        }
        Ok(())
    }
}
