//! Guest ports: the open ports of every sandbox, by token. A port is closed until a client
//! opens it (`POST /v1/sandboxes/{id}/ports`), which makes a token of 128 random bits for
//! that sandbox and port alone; the port listener ([`super::listener`]) lets through only a
//! connection that names one.

use std::net::SocketAddr;

use engine::book::Kind;

use crate::entries::Card;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::wire::{PortList, PortView};

/// Open ports per sandbox, at most.
pub const MAX_PORTS: usize = 64;

/// How open ports' URLs are made. The ports themselves, with their tokens, are on each
/// sandbox's card in the book ([`Card::ports`]), and go with it.
pub struct Ports {
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
        Ports { address, domain }
    }

    fn view(&self, token: &str, port: u16) -> PortView {
        let listen = self.address.port();
        PortView {
            port,
            url: format!("http://{token}.{}:{listen}/", self.domain),
            token: token.to_string(),
            address: self.address.to_string(),
            header: "Farm-Port-Token".into(),
        }
    }

    /// Opens `port` of the sandbox `sandbox` whose card this is (the same token again when
    /// it is open already).
    pub fn open(&self, card: &mut Card, sandbox: &str, port: u64) -> ApiResult<PortView> {
        crate::bounds::range("port", port, (1, 65535), "(a TCP port)")?;
        let port = port as u16;
        if let Some(token) = card.ports.get(&port) {
            return Ok(self.view(token, port));
        }
        if card.ports.len() >= MAX_PORTS {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "port",
                format!("sandbox {sandbox} has {MAX_PORTS} open ports, the most it may: close one"),
            ));
        }
        let token = new_token();
        let view = self.view(&token, port);
        card.ports.insert(port, token);
        Ok(view)
    }

    /// The domain under which E2B's host names of a sandbox's ports (`{port}-{id}.` it)
    /// reach the listener: the sandbox's host key, the listener's domain and its port.
    pub fn host_domain(&self, key: &str) -> String {
        format!("{key}.{}:{}", self.domain, self.address.port())
    }

    /// The open ports on a sandbox's card, by port.
    pub fn list(&self, card: &Card) -> PortList {
        PortList {
            ports: card.ports.iter().map(|(port, token)| self.view(token, *port)).collect(),
        }
    }
}

/// The sandbox and port `token` opens, among the book's cards.
pub(super) fn lookup<'a>(
    mut cards: impl Iterator<Item = (&'a str, Kind, bool, &'a Card)>,
    token: &str,
) -> Option<(String, u16)> {
    cards.find_map(|(id, kind, _, card)| {
        let port = card.ports.iter().find(|(_, t)| t.as_str() == token)?.0;
        (kind == Kind::Sandbox).then(|| (id.to_string(), *port))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> Card {
        Card {
            owner: tenants::DEFAULT,
            memory_mib: 512,
            environment: None,
            ports: Default::default(),
        }
    }

    #[test]
    fn a_token_opens_one_sandbox_and_port_and_closing_forgets_it() {
        let ports = Ports::new("127.0.0.1:8766".parse().unwrap(), "localhost".into());
        let (mut a_card, mut b_card) = (card(), card());
        let a = ports.open(&mut a_card, "sb-a", 8000).unwrap();
        assert_eq!(
            ports.open(&mut a_card, "sb-a", 8000).unwrap().token,
            a.token,
            "opened again: the same"
        );
        let b = ports.open(&mut b_card, "sb-b", 8000).unwrap();
        assert_ne!(a.token, b.token);
        assert_eq!(a.url, format!("http://{}.localhost:8766/", a.token));
        let found = |a: &Card, b: &Card, token: &str| {
            let cards = [("sb-a", Kind::Sandbox, false, a), ("sb-b", Kind::Sandbox, false, b)];
            lookup(cards.into_iter(), token)
        };
        assert_eq!(found(&a_card, &b_card, &a.token), Some(("sb-a".into(), 8000)));
        assert_eq!(found(&a_card, &b_card, &b.token), Some(("sb-b".into(), 8000)));
        assert_eq!(found(&a_card, &b_card, "not-a-token"), None);
        // A session's card never opens a port, whatever it holds.
        let session = vec![("s-1", Kind::Session, false, &a_card)];
        assert_eq!(lookup(session.into_iter(), &a.token), None);
        for bad in [0, 65536, 1 << 40] {
            assert_eq!(
                ports.open(&mut a_card, "sb-a", bad).unwrap_err().field.as_deref(),
                Some("port")
            );
        }
        assert_eq!(ports.list(&a_card).ports.len(), 1);
        assert!(a_card.ports.remove(&8000).is_some());
        assert_eq!(found(&a_card, &b_card, &a.token), None);
        let mut c_card = card();
        for port in 1..=MAX_PORTS as u64 {
            ports.open(&mut c_card, "sb-c", port).unwrap();
        }
        assert!(
            ports.open(&mut c_card, "sb-c", 9999).is_err(),
            "past the most a sandbox may open"
        );
        let listed: Vec<u16> = ports.list(&c_card).ports.iter().map(|p| p.port).collect();
        assert_eq!(listed, (1..=MAX_PORTS as u16).collect::<Vec<_>>(), "listed by port");
    }
}
