//! How a group of heartbeat requests is applied in one transaction. The store locks the
//! sessions the group names and reads which of its orgs exist; these rules decide each
//! request whole (an unknown org, or a session of another org, refuses it all), name the
//! sessions to create, and apply every accepted heartbeat in (session, seq) order,
//! gathering what to book. The store writes the result and commits.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Heartbeat, HeartbeatOutcome, IngestReject};
use crate::booking::Booking;
use crate::ledger::{receive, Effects, Rules};
use crate::session::Session;

/// A request's answer: one outcome per heartbeat, or why it was refused whole.
pub type RequestOutcome = Result<Vec<HeartbeatOutcome>, IngestReject>;

/// The orgs of a group whose existence the store must check, sorted: an org that owns one
/// of the locked sessions exists (orgs are never deleted), so only the others are asked.
pub fn unproven_orgs<'a>(
    requests: &'a [Vec<Heartbeat>],
    sessions: &HashMap<String, Session>,
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
    /// Sessions first seen in the group, by id: each starts at its earliest accepted
    /// heartbeat, whatever the order they came in, and belongs to the first request that
    /// names it.
    pub created: BTreeMap<String, Session>,
}

/// Decide each request whole, in arrival order. `sessions` are the locked sessions the
/// group names (each found in the org that names it); `owners` the org of each named
/// session that exists but was not locked (another org's); `found` the orgs the store
/// found among `unproven_orgs`.
pub fn screen(
    requests: &[Vec<Heartbeat>],
    sessions: &HashMap<String, Session>,
    owners: &HashMap<String, String>,
    found: &[String],
) -> Screened {
    let mut known: HashSet<&str> = sessions.values().map(|s| s.org_id.as_str()).collect();
    known.extend(found.iter().map(String::as_str));
    let mut out = Screened::default();
    for request in requests {
        let verdict = check_request(request, &known, sessions, owners, &out.created);
        if verdict.is_ok() {
            for h in request {
                if !sessions.contains_key(h.session_id.as_str()) {
                    out.created
                        .entry(h.session_id.to_string())
                        .or_insert_with(|| new_session(h));
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
        if let Some(s) = out.created.get_mut(h.session_id.as_str()) {
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

fn check_request(
    request: &[Heartbeat],
    known_orgs: &HashSet<&str>,
    sessions: &HashMap<String, Session>,
    owners: &HashMap<String, String>,
    created: &BTreeMap<String, Session>,
) -> Result<(), IngestReject> {
    for (index, h) in request.iter().enumerate() {
        if !known_orgs.contains(h.org_id.as_str()) {
            return Err(IngestReject::UnknownOrg {
                index,
                org_id: h.org_id.to_string(),
            });
        }
        let owner = sessions
            .get(h.session_id.as_str())
            .or_else(|| created.get(h.session_id.as_str()))
            .map(|s| s.org_id.as_str())
            .or_else(|| owners.get(h.session_id.as_str()).map(String::as_str));
        if owner.is_some_and(|o| o != h.org_id.as_str()) {
            return Err(IngestReject::SessionOfAnotherOrg {
                index,
                session_id: h.session_id.to_string(),
            });
        }
    }
    // Within one request, a session named under two orgs is refused too.
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (index, h) in request.iter().enumerate() {
        let org = *seen
            .entry(h.session_id.as_str())
            .or_insert(h.org_id.as_str());
        if org != h.org_id.as_str() {
            return Err(IngestReject::SessionOfAnotherOrg {
                index,
                session_id: h.session_id.to_string(),
            });
        }
    }
    Ok(())
}

/// Apply every heartbeat of the accepted requests to `sessions` (which must hold every
/// session they name: the locked ones and the created ones), in (session, seq) order.
/// Returns each request's answer, and what to book.
pub fn apply(
    requests: &[Vec<Heartbeat>],
    verdicts: Vec<Result<(), IngestReject>>,
    sessions: &mut HashMap<String, Session>,
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
        (x.session_id.as_str(), x.obs.seq, a).cmp(&(y.session_id.as_str(), y.obs.seq, b))
    });
    let mut outcomes: Vec<Vec<Option<HeartbeatOutcome>>> =
        requests.iter().map(|r| vec![None; r.len()]).collect();
    let mut booking = Booking::default();
    for (r, i) in order {
        let h = &requests[r][i];
        let s = sessions
            .get_mut(h.session_id.as_str())
            .expect("every accepted session was read or created");
        // Judged at its arrival, as the reference ledger does: whether a held heartbeat's
        // wait is over depends on when this one came, never on the commit's moment.
        let step = receive(&s.ledger, &h.obs, h.received_at, rules);
        let changed = step.ledger != s.ledger;
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
    fn a_request_naming_an_unknown_org_or_another_orgs_session_is_refused_whole() {
        let mut sessions = HashMap::new();
        sessions.insert("theirs".to_owned(), Session::admitted("b", "theirs", 0));
        let requests = vec![
            vec![hb("a", "s1", 1, 10, VmState::Running)],
            vec![
                hb("a", "s2", 1, 10, VmState::Running),
                hb("a", "theirs", 1, 10, VmState::Running),
            ],
            vec![hb("nobody", "s3", 1, 10, VmState::Running)],
            vec![
                hb("a", "s4", 1, 10, VmState::Running),
                hb("c", "s4", 2, 11, VmState::Running),
            ],
            vec![hb("a", "elsewhere", 1, 10, VmState::Running)],
        ];
        assert_eq!(unproven_orgs(&requests, &sessions), ["a", "c", "nobody"]);
        let owners = HashMap::from([("elsewhere".to_owned(), "b".to_owned())]);
        let out = screen(&requests, &sessions, &owners, &["a".into(), "c".into()]);
        assert_eq!(out.verdicts[0], Ok(()));
        assert!(matches!(
            out.verdicts[1],
            Err(IngestReject::SessionOfAnotherOrg { index: 1, .. })
        ));
        assert!(matches!(
            out.verdicts[2],
            Err(IngestReject::UnknownOrg { index: 0, .. })
        ));
        assert!(matches!(
            out.verdicts[3],
            Err(IngestReject::SessionOfAnotherOrg { index: 1, .. })
        ));
        // A session of another org that this group's locks did not find.
        assert!(matches!(
            out.verdicts[4],
            Err(IngestReject::SessionOfAnotherOrg { index: 0, .. })
        ));
        assert_eq!(out.created.keys().collect::<Vec<_>>(), ["s1"]);
    }

    #[test]
    fn a_new_session_starts_at_its_earliest_beat_and_beats_apply_in_seq_order() {
        let requests = vec![
            vec![hb("a", "s", 2, 25, VmState::Parked)],
            vec![hb("a", "s", 1, 10, VmState::Running)],
        ];
        let mut sessions = HashMap::new();
        let screened = screen(&requests, &sessions, &HashMap::new(), &["a".into()]);
        assert_eq!(screened.created["s"].ledger.last_at, 10);
        sessions.extend(screened.created);
        let (answers, booking) = apply(&requests, screened.verdicts, &mut sessions, &RULES);
        assert_eq!(booking.billed_seconds(), 15);
        assert_eq!(sessions["s"].ledger.phase, Phase::Parked);
        let outcome = |r: usize| answers[r].as_ref().unwrap()[0].clone();
        assert!(!outcome(0).duplicate && !outcome(1).duplicate);
        // The same beat again changes nothing.
        let (again, booking) = apply(&requests[1..], vec![Ok(())], &mut sessions, &RULES);
        assert!(again[0].as_ref().unwrap()[0].duplicate);
        assert!(booking.is_empty());
    }
}
