//! How clients reach a sandbox's own servers: its open ports (each with its token, on its
//! card), E2B's host names, and connections to its guest's loopback for a front door that
//! speaks to a server in it.

use super::{SandboxId, Sandboxes};
use crate::entries::Card;
use crate::error::{ApiError, ApiResult, ErrorKind};
use engine::book::Kind;
use engine::guest::Guest;

impl Sandboxes {
    /// `POST /v1/sandboxes/{id}/ports`: opens a guest port to clients.
    pub async fn open_port(&self, id: &SandboxId, port: u64) -> ApiResult<crate::wire::PortView> {
        let sandbox = self.get(id)?;
        let opened = self.with_card(id, |card| self.ports.open(card, id, port))?;
        self.save_record(&*sandbox.lock().await);
        Ok(opened)
    }

    pub async fn ports(&self, id: &SandboxId) -> ApiResult<crate::wire::PortList> {
        self.get(id)?;
        self.with_card(id, |card| Ok(self.ports.list(card)))
    }

    /// `DELETE /v1/sandboxes/{id}/ports/{port}`.
    pub async fn close_port(&self, id: &SandboxId, port: u16) -> ApiResult<crate::wire::PortList> {
        let sandbox = self.get(id)?;
        let closed = self.with_card(id, |card| Ok(card.ports.remove(&port).is_some()))?;
        self.save_record(&*sandbox.lock().await);
        if !closed {
            return Err(ApiError::field(
                ErrorKind::NotFound,
                "port",
                format!("port {port} of sandbox {id} is not open"),
            ));
        }
        self.with_card(id, |card| Ok(self.ports.list(card)))
    }

    /// `change` on a sandbox's card in the book, under the book's lock (NotFound once the
    /// sandbox went: nothing is left behind for a sandbox that ended meanwhile).
    fn with_card<T>(&self, id: &str, change: impl FnOnce(&mut Card) -> ApiResult<T>) -> ApiResult<T> {
        let mut forks = self.forks();
        let card = forks
            .card_mut(id, Kind::Sandbox)
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no sandbox {id:?}")))?;
        change(card)
    }

    /// The sandbox and port a port token opens.
    pub(crate) fn port_of_token(&self, token: &str) -> Option<(String, u16)> {
        crate::sandbox::ports::lookup(self.forks().cards(), token)
    }

    /// Whether `key` opens the ports of sandbox `sandbox` by E2B's host names.
    pub(crate) fn is_host_key(&self, sandbox: &str, key: &str) -> bool {
        self.tenancy.is_sandbox_host_key(sandbox, key)
    }

    /// The `domain` E2B's SDK is given for sandbox `id` of `tenant`: its `get_host(port)`,
    /// `{port}-{id}.{domain}`, is then a host name of the port listener that opens that
    /// port (`KEY.DOMAIN:PORT`, the key [`crate::tenancy::Tenancy::sandbox_host_key`]).
    pub fn e2b_domain(&self, tenant: tenants::TenantId, id: &SandboxId) -> String {
        self.ports.host_domain(&self.tenancy.sandbox_host_key(tenant, id))
    }

    /// The guest behind an open port (409 while its sandbox is paused; 503 under half the
    /// memory reserve, as a command), and a guard that keeps the sandbox from idling while
    /// the connection lasts.
    pub(crate) async fn port_guest(&self, id: &str) -> ApiResult<(Guest, impl Drop + Send + 'static)> {
        self.room_to_run()?;
        let in_use = self.begin(id);
        Ok((self.guest(id).await?, in_use))
    }

    /// A connection to `port` on the guest's own loopback, for a front door that speaks to a
    /// server in the sandbox (E2B's code interpreter), and a guard that keeps the sandbox
    /// from idling while it lasts. A port where nothing listens gives a stream that ends at
    /// once. 409 while the sandbox is paused.
    pub async fn connect_port(
        &self,
        id: &SandboxId,
        port: u16,
    ) -> ApiResult<(tokio::io::DuplexStream, Box<dyn Send + 'static>)> {
        let (guest, in_use) = self.port_guest(id).await?;
        let stream = guest.connect(port).await.map_err(|e| {
            ApiError::new(
                ErrorKind::GuestFailed,
                format!("cannot reach port {port} of sandbox {id}: {e}"),
            )
        })?;
        Ok((stream, Box::new(in_use)))
    }
}
