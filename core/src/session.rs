//! A session as the meter keeps it: who it belongs to, what runs it, and its ledger.

use crate::ledger::SessionLedger;
use crate::time::Secs;

/// Which session: its org and its id, which is its org's own (two orgs' sessions of one id
/// are two sessions).
pub type SessionKey = (String, String);

/// The key of the session `session_id` of `org_id`.
pub fn key(org_id: &str, session_id: &str) -> SessionKey {
    (org_id.to_owned(), session_id.to_owned())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub org_id: String,
    pub session_id: String,
    /// The API key whose slot it holds; `None` until the gate admits it.
    pub key_id: Option<String>,
    pub agent: Option<String>,
    pub project_id: Option<String>,
    pub started_by: Option<String>,
    pub vm_id: Option<String>,
    pub ledger: SessionLedger,
    /// Billed without the gate's admission: first seen through a heartbeat.
    pub unadmitted: bool,
    pub created_at: Secs,
    /// The meter's clock when a heartbeat was last applied.
    pub heard_at: Option<Secs>,
    /// Last admission by the gate (written only by the gate, never by heartbeats).
    pub slot_at: Option<Secs>,
}

impl Session {
    /// Its org and id.
    pub fn key(&self) -> SessionKey {
        key(&self.org_id, &self.session_id)
    }

    /// A session with `ledger`, known by its ids alone.
    pub fn new(org_id: &str, session_id: &str, ledger: SessionLedger) -> Session {
        Session {
            org_id: org_id.to_owned(),
            session_id: session_id.to_owned(),
            key_id: None,
            agent: None,
            project_id: None,
            started_by: None,
            vm_id: None,
            created_at: ledger.last_at,
            ledger,
            unadmitted: false,
            heard_at: None,
            slot_at: None,
        }
    }

    /// A session the gate admits at `at`, before any heartbeat.
    pub fn admitted(org_id: &str, session_id: &str, at: Secs) -> Session {
        Session::new(org_id, session_id, SessionLedger::admitted(at))
    }

    /// A session first seen through a heartbeat, never admitted by the gate: it is billed
    /// all the same (its VM runs) and flagged. `heard_at` is set as its heartbeats apply.
    pub fn unadmitted(org_id: &str, session_id: &str, vm_id: &str, at: Secs) -> Session {
        let mut s = Session::admitted(org_id, session_id, at);
        s.vm_id = Some(vm_id.to_owned());
        s.unadmitted = true;
        s
    }
}
