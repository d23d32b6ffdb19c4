//! How a group of heartbeat requests is applied in one transaction. The store locks the
//! sessions the group names and reads which of its orgs exist; these rules decide each
//! request whole (an unknown org refuses it all), name the sessions to create, and apply
//! every accepted heartbeat in (org, session, seq) order, gathering what to book. The
//! store writes the result and commits. A session is named by its org and its id, which
//! is its org's own.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Heartbeat, HeartbeatOutcome, IngestReject};
use crate::booking::Booking;
use crate::ledger::{receive, Effects, Phase, Rules};
use crate::session::{key, Session, SessionKey};

/// A request's answer: one outcome per heartbeat, or why it was refused whole.
pub type RequestOutcome = Result<Vec<HeartbeatOutcome>, IngestReject>;

/// The key of the session a heartbeat is of.
fn key_of(h: &Heartbeat) -> SessionKey {
    key(h.org_id.as_str(), h.session_id.as_str())
}

/// The orgs of a group whose existence the store must check, sorted: an org that owns one
/// of the locked sessions exists (orgs are never deleted), so only the others are asked.
pub fn unproven_orgs<'a>(
    requests: &'a [Vec<Heartbeat>],
    sessions: &HashMap<SessionKey, Session>,
) -> Vec<&'a str> {
    let owners: HashSet<&str> = sessions.values().map(|s| s.org_id.as_str()).collect();
    let mut unproven: Vec<&str> = requests
        .iter()
        .flatten()
        .map(|h| h.org_id.as_str())
        .filter(|o| !owners.contains(o))
        .collect();
    unproven.sort_unstable();
    unproven.dedup();
    unproven
}

/// Which requests of a group are accepted, and the sessions they create.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Screened {
    /// One per request, in order.
    pub verdicts: Vec<Result<(), IngestReject>>,
    /// Sessions first seen in the group, by org and id: each starts at its earliest
    /// accepted heartbeat, whatever the order they came in.
    pub created: BTreeMap<SessionKey, Session>,
}

/// Decide each request whole, in arrival order. `sessions` are the locked sessions the
/// group names; `found` the orgs the store found among `unproven_orgs`.
pub fn screen(
    requests: &[Vec<Heartbeat>],
    sessions: &HashMap<SessionKey, Session>,
    found: &[String],
) -> Screened {
    let mut known: HashSet<&str> = sessions.values().map(|s| s.org_id.as_str()).collect();
    known.extend(found.iter().map(String::as_str));
    let mut out = Screened::default();
    for request in requests {
        let verdict = check_request(request, &known);
        if verdict.is_ok() {
            for h in request {
                let k = key_of(h);
                if !sessions.contains_key(&k) {
                    out.created.entry(k).or_insert_with(|| new_session(h));
                }
            }
        }
        out.verdicts.push(verdict);
    }
    let accepted = requests
        .iter()
        .zip(&out.verdicts)
        .filter(|(_, v)| v.is_ok())
        .flat_map(|(r, _)| r);
    for h in accepted {
        if let Some(s) = out.created.get_mut(&key_of(h)) {
            if h.obs.at < s.ledger.last_at {
                *s = new_session(h);
            }
        }
    }
    out
}

fn new_session(h: &Heartbeat) -> Session {
    Session::unadmitted(
        h.org_id.as_str(),
        h.session_id.as_str(),
        h.vm_id.as_str(),
        h.obs.at,
    )
}

/// A request is refused whole when one of its heartbeats names an org that does not exist.
pub(crate) fn check_request(
    request: &[Heartbeat],
    known_orgs: &HashSet<&str>,
) -> Result<(), IngestReject> {
    match request
        .iter()
        .position(|h| !known_orgs.contains(h.org_id.as_str()))
    {
        Some(index) => Err(IngestReject::UnknownOrg {
            index,
            org_id: request[index].org_id.to_string(),
        }),
        None => Ok(()),
    }
}

/// Apply every heartbeat of the accepted requests to `sessions` (which must hold every
/// session they name: the locked ones and the created ones), in (session, seq) order.
/// Returns each request's answer, and what to book.
pub fn apply(
    requests: &[Vec<Heartbeat>],
    verdicts: Vec<Result<(), IngestReject>>,
    sessions: &mut HashMap<SessionKey, Session>,
    rules: &Rules,
) -> (Vec<RequestOutcome>, Booking) {
    let mut order: Vec<(usize, usize)> = verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_ok())
        .flat_map(|(r, _)| (0..requests[r].len()).map(move |i| (r, i)))
        .collect();
    order.sort_by(|a, b| {
        let (x, y) = (&requests[a.0][a.1], &requests[b.0][b.1]);
        let x = (x.org_id.as_str(), x.session_id.as_str(), x.obs.seq, a);
        x.cmp(&(y.org_id.as_str(), y.session_id.as_str(), y.obs.seq, b))
    });
    let mut outcomes: Vec<Vec<Option<HeartbeatOutcome>>> =
        requests.iter().map(|r| vec![None; r.len()]).collect();
    let mut booking = Booking::default();
    for (r, i) in order {
        let h = &requests[r][i];
        let s = sessions
            .get_mut(&key_of(h))
            .expect("every accepted session was read or created");
        // Judged at its arrival, as the reference ledger does: whether a held heartbeat's
        // wait is over depends on when this one came, never on the commit's moment.
        let step = receive(&s.ledger, &h.obs, h.received_at, rules);
        let changed = step.ledger != s.ledger;
        // Parked by a heartbeat, it gives up its slot (the store's upsert does the same).
        if step.ledger.phase == Phase::Parked && s.ledger.phase != Phase::Parked {
            s.slot_at = None;
        }
        s.ledger = step.ledger;
        if !step.duplicate {
            s.vm_id = Some(h.vm_id.to_string());
            s.heard_at = s.heard_at.max(Some(h.received_at));
        }
        for fx in &step.effects {
            booking.add(s, fx);
        }
        // Held, nothing booked: the row is written all the same.
        if (changed || !step.duplicate) && step.effects.is_empty() {
            booking.add(s, &Effects::default());
        }
        outcomes[r][i] = Some(HeartbeatOutcome {
            session_id: s.session_id.clone(),
            org_id: s.org_id.clone(),
            duplicate: step.duplicate,
            phase: s.ledger.phase,
            members: limited_members(s),
        });
    }
    let answers = verdicts
        .into_iter()
        .zip(outcomes)
        .map(|(v, outs)| v.map(|()| outs.into_iter().map(|o| o.expect("applied")).collect()))
        .collect();
    (answers, booking)
}

/// The members of a session an org may limit: its user, project and key.
fn limited_members(s: &Session) -> Vec<(crate::members::Dimension, String)> {
    use crate::members::{member_of, LimitKind};
    LimitKind::ALL
        .iter()
        .map(|k| (k.dimension(), member_of(s, k.dimension()).to_owned()))
        .filter(|(_, id)| !id.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Id;
    use crate::ledger::{Observation, Phase, VmState};

    const RULES: Rules = Rules {
        interval: 15,
        lease: 45,
    };

    fn hb(org: &str, session: &str, seq: i64, at: i64, state: VmState) -> Heartbeat {
        Heartbeat {
            org_id: Id::parse(org).unwrap(),
            session_id: Id::parse(session).unwrap(),
            vm_id: Id::parse("vm").unwrap(),
            obs: Observation { seq, at, state },
            received_at: at,
        }
    }

    #[test]
    fn a_request_naming_an_unknown_org_is_refused_whole() {
        let mut sessions = HashMap::new();
        sessions.insert(key("b", "theirs"), Session::admitted("b", "theirs", 0));
        let requests = vec![
            vec![hb("a", "s1", 1, 10, VmState::Running)],
            vec![
                hb("a", "s2", 1, 10, VmState::Running),
                hb("nobody", "s3", 1, 10, VmState::Running),
            ],
        ];
        assert_eq!(unproven_orgs(&requests, &sessions), ["a", "nobody"]);
        let out = screen(&requests, &sessions, &["a".into()]);
        assert_eq!(out.verdicts[0], Ok(()));
        assert!(matches!(
            out.verdicts[1],
            Err(IngestReject::UnknownOrg { index: 1, .. })
        ));
        assert_eq!(out.created.keys().collect::<Vec<_>>(), [&key("a", "s1")]);
    }

    /// A session id is its org's own: two orgs' heartbeats of one id, in one request or
    /// beside another org's session of that id, are of two sessions.
    #[test]
    fn two_orgs_sessions_of_one_id_are_two_sessions() {
        let mut sessions = HashMap::new();
        sessions.insert(key("b", "s"), Session::admitted("b", "s", 0));
        let requests = vec![vec![
            hb("a", "s", 1, 10, VmState::Running),
            hb("c", "s", 1, 10, VmState::Running),
        ]];
        let out = screen(&requests, &sessions, &["a".into(), "c".into()]);
        assert_eq!(out.verdicts[0], Ok(()));
        assert_eq!(
            out.created.keys().collect::<Vec<_>>(),
            [&key("a", "s"), &key("c", "s")]
        );
        sessions.extend(out.created);
        let (answers, _) = apply(&requests, out.verdicts, &mut sessions, &RULES);
        let orgs: Vec<_> = answers[0]
            .as_ref()
            .unwrap()
            .iter()
            .map(|o| o.org_id.as_str())
            .collect();
        assert_eq!(orgs, ["a", "c"]);
        assert_eq!(
            sessions[&key("b", "s")].ledger.last_at,
            0,
            "b's session is untouched"
        );
    }

    #[test]
    fn a_new_session_starts_at_its_earliest_beat_and_beats_apply_in_seq_order() {
        let requests = vec![
            vec![hb("a", "s", 2, 25, VmState::Parked)],
            vec![hb("a", "s", 1, 10, VmState::Running)],
        ];
        let mut sessions = HashMap::new();
        let screened = screen(&requests, &sessions, &["a".into()]);
        assert_eq!(screened.created[&key("a", "s")].ledger.last_at, 10);
        sessions.extend(screened.created);
        let (answers, booking) = apply(&requests, screened.verdicts, &mut sessions, &RULES);
        assert_eq!(booking.billed_seconds(), 15);
        assert_eq!(sessions[&key("a", "s")].ledger.phase, Phase::Parked);
        let outcome = |r: usize| answers[r].as_ref().unwrap()[0].clone();
        assert!(!outcome(0).duplicate && !outcome(1).duplicate);
        // The same beat again changes nothing.
        let (again, booking) = apply(&requests[1..], vec![Ok(())], &mut sessions, &RULES);
        assert!(again[0].as_ref().unwrap()[0].duplicate);
        assert!(booking.is_empty());
    }
}
