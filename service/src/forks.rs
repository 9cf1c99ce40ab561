//! The service's book of open forks (sessions and sandboxes), and the guards that hold a
//! place in it: a VM slot being filled, a request in use.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use engine::book::Book;

use super::entries::{Card, Open};

/// Every open fork of the service, sessions and sandboxes, in one book: slots of forks
/// opening, who is being submitted (a process killed while a session is submitted reports it
/// lost on restart, as no end was recorded), timers.
pub type Forks = Arc<Mutex<Book<Open, Card>>>;

/// A VM slot taken by [`Service::vm_slot`]: given back when dropped, unless the fork it was
/// for opened (or resumed) and took it ([`VmSlot::taken`]).
pub struct VmSlot(pub Option<Forks>);

impl VmSlot {
    /// The fork opened or resumed in this slot: the book counts it now.
    pub fn taken(mut self) {
        self.0 = None;
    }
}

impl Drop for VmSlot {
    fn drop(&mut self) {
        if let Some(forks) = self.0.take() {
            forks.lock().unwrap_or_else(|p| p.into_inner()).release();
        }
    }
}

/// A request using an open fork: it is not idle until this drops (then it was used last).
pub struct InUse {
    forks: Forks,
    id: String,
}

impl InUse {
    pub fn begin(forks: &Forks, id: &str) -> InUse {
        forks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .begin(id, Instant::now());
        InUse {
            forks: forks.clone(),
            id: id.to_string(),
        }
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.forks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish(&self.id, Instant::now());
    }
}
