//! One session as its callers end and read it. A session is named by its org and its id,
//! which is its org's own; routes that name it without its org (deprecated) find the org
//! by the id, off the hot path.

use rush_meter_core::ledger::EndStatus;
use rush_meter_core::session::Session;
use rush_meter_core::time::Secs;

use super::{Outcome, Refusal, Services};

impl Services {
    /// The org of session `session_id`: `org_id` when the caller names one (in its path,
    /// or by a token bound to it), else the one org that has a session of that id
    /// (`SessionIdShared` when several do).
    pub async fn org_of_session(&self, org_id: Option<&str>, session_id: &str) -> Outcome<String> {
        if let Some(org) = org_id {
            return Ok(org.to_owned());
        }
        let mut orgs = self.db.orgs_with_session(session_id, 2).await?;
        match orgs.len() {
            0 => Err(Refusal::SessionNotFound(session_id.to_owned())),
            1 => Ok(orgs.remove(0)),
            _ => Err(Refusal::SessionIdShared(session_id.to_owned())),
        }
    }

    /// End the org's session; ending it again changes nothing. The session as ended.
    pub async fn end_session(
        &self,
        org_id: &str,
        session_id: &str,
        status: EndStatus,
    ) -> Outcome<Session> {
        let now = self.clock.now();
        let row = self
            .db
            .end_session(org_id, session_id, status, now, &self.rules, &self.plans)
            .await?
            .ok_or_else(|| Refusal::SessionNotFound(session_id.to_owned()))?;
        self.metrics.session_ends.inc();
        Ok(row)
    }

    /// The org's session and its closed spans: `(start, end, phase)`, oldest first.
    pub async fn session_with_spans(
        &self,
        org_id: &str,
        session_id: &str,
    ) -> Outcome<(Session, Vec<(Secs, Secs, String)>)> {
        let (row, spans) = tokio::join!(
            self.db.get_session(org_id, session_id),
            self.db.session_spans(org_id, session_id)
        );
        let row = row?.ok_or_else(|| Refusal::SessionNotFound(session_id.to_owned()))?;
        Ok((row, spans?))
    }
}
