//! What a live fork may reach, changed while it lives: a session's or sandbox's policy is
//! given to its VM now (connections the new policy would not open are cut) and to every VM it
//! gets later (a resume, a branch, a reset by a fresh fork).

use super::{Session, Vm};

impl Session {
    /// What it may reach from now on.
    pub fn set_network(&mut self, network: egress::Policy) {
        if let Vm::Live(live) = &self.vm {
            live.fork.machine.set_network(network.clone());
        }
        self.network = network;
    }
}
