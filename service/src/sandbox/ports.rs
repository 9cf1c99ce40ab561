//! Guest ports: the open ports of every sandbox, by token. A port is closed until a client
//! opens it (`POST /v1/sandboxes/{id}/ports`), which makes a token of 128 random bits for
//! that sandbox and port alone; the port listener ([`super::listener`]) lets through only a
//! connection that names one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::wire::{PortList, PortView};

/// Open ports per sandbox, at most.
pub const MAX_PORTS: usize = 64;

/// Where an open port leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Opened {
    pub(super) sandbox: String,
    pub(super) port: u16,
}

/// The open ports of every sandbox, by token, and how their URLs are made.
pub struct Ports {
    by_token: Mutex<HashMap<String, Opened>>,
    /// Where the listener listens.
    pub address: SocketAddr,
    /// The domain token host names are under (`localhost`: browsers resolve
    /// `TOKEN.localhost` to loopback).
    domain: String,
}

/// A new token: 128 random bits, as 32 hex digits (a DNS label).
fn new_token() -> String {
    crate::ids::random_hex()
}

impl Ports {
    pub fn new(address: SocketAddr, domain: String) -> Ports {
        Ports {
            by_token: Mutex::new(HashMap::new()),
            address,
            domain,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Opened>> {
        self.by_token.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn view(&self, token: &str, opened: &Opened) -> PortView {
        let listen = self.address.port();
        PortView {
            port: opened.port,
            url: format!("http://{token}.{}:{listen}/", self.domain),
            token: token.to_string(),
            address: self.address.to_string(),
            header: "Farm-Port-Token".into(),
        }
    }

    /// Opens `port` of `sandbox` (the same token again when it is open already).
    pub fn open(&self, sandbox: &str, port: u64) -> ApiResult<PortView> {
        crate::bounds::range("port", port, (1, 65535), "(a TCP port)")?;
        let opened = Opened {
            sandbox: sandbox.to_string(),
            port: port as u16,
        };
        let mut all = self.lock();
        if let Some((token, _)) = all.iter().find(|(_, o)| **o == opened) {
            return Ok(self.view(token, &opened));
        }
        if all.values().filter(|o| o.sandbox == sandbox).count() >= MAX_PORTS {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "port",
                format!("sandbox {sandbox} has {MAX_PORTS} open ports, the most it may: close one"),
            ));
        }
        let token = new_token();
        let view = self.view(&token, &opened);
        all.insert(token, opened);
        Ok(view)
    }

    /// Opens `port` of `sandbox` again with the token it had (a restart taking it up).
    pub fn reopen(&self, sandbox: &str, port: u16, token: &str) {
        let opened = Opened {
            sandbox: sandbox.to_string(),
            port,
        };
        self.lock().insert(token.to_string(), opened);
    }

    /// The open ports of `sandbox`.
    pub fn list(&self, sandbox: &str) -> PortList {
        let all = self.lock();
        let mut ports: Vec<PortView> = all
            .iter()
            .filter(|(_, o)| o.sandbox == sandbox)
            .map(|(token, o)| self.view(token, o))
            .collect();
        ports.sort_by_key(|p| p.port);
        PortList { ports }
    }

    /// Closes `port` of `sandbox`; false when it was not open.
    pub fn close(&self, sandbox: &str, port: u16) -> bool {
        let mut all = self.lock();
        let before = all.len();
        all.retain(|_, o| !(o.sandbox == sandbox && o.port == port));
        all.len() < before
    }

    /// Closes every port of a sandbox that went.
    pub fn close_all(&self, sandbox: &str) {
        self.lock().retain(|_, o| o.sandbox != sandbox);
    }

    pub(super) fn lookup(&self, token: &str) -> Option<Opened> {
        self.lock().get(token).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_one_sandbox_and_port_and_closing_forgets_it() {
        let ports = Ports::new("127.0.0.1:8766".parse().unwrap(), "localhost".into());
        let a = ports.open("sb-a", 8000).unwrap();
        assert_eq!(
            ports.open("sb-a", 8000).unwrap().token,
            a.token,
            "opened again: the same"
        );
        let b = ports.open("sb-b", 8000).unwrap();
        assert_ne!(a.token, b.token);
        assert_eq!(a.url, format!("http://{}.localhost:8766/", a.token));
        assert_eq!(
            ports.lookup(&a.token),
            Some(Opened {
                sandbox: "sb-a".into(),
                port: 8000
            })
        );
        for bad in [0, 65536, 1 << 40] {
            assert_eq!(ports.open("sb-a", bad).unwrap_err().field.as_deref(), Some("port"));
        }
        assert!(ports.close("sb-a", 8000));
        assert!(!ports.close("sb-a", 8000));
        assert_eq!(ports.lookup(&a.token), None);
        ports.close_all("sb-b");
        assert_eq!(ports.lookup(&b.token), None);
        for port in 1..=MAX_PORTS as u64 {
            ports.open("sb-c", port).unwrap();
        }
        assert!(ports.open("sb-c", 9999).is_err(), "past the most a sandbox may open");
    }
}
