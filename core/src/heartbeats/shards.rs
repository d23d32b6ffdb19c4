//! A group of heartbeat requests cut by the shard of each heartbeat's org, so that a
//! distributed store commits each shard's part as a transaction of one worker (no
//! two-phase commit), and the parts' answers put back in the requests' order.
//!
//! Each request is judged whole before any part commits (`check`): a request naming an
//! unknown org is refused whole and no part of it is written. Orgs are never deleted, so
//! a part of an accepted request is accepted again under its shard's locks.

use std::collections::{BTreeMap, HashSet};

use super::group::{check_request, RequestOutcome};
use super::{Heartbeat, HeartbeatOutcome, IngestReject};

/// Each request's verdict, judged whole against the orgs that exist (`found`).
pub fn check(requests: &[Vec<Heartbeat>], found: &[String]) -> Vec<Result<(), IngestReject>> {
    let known: HashSet<&str> = found.iter().map(String::as_str).collect();
    requests.iter().map(|r| check_request(r, &known)).collect()
}

/// One shard's part of a group: the heartbeats of its orgs from each accepted request,
/// as requests of their own, and where each came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub shard: i64,
    pub requests: Vec<Vec<Heartbeat>>,
    /// For each of `requests`: the request it was cut from, and each heartbeat's index
    /// there.
    origin: Vec<(usize, Vec<usize>)>,
}

/// The accepted requests cut by shard, in shard order (rejected requests have no part).
pub fn split(
    requests: &[Vec<Heartbeat>],
    verdicts: &[Result<(), IngestReject>],
    shard_of: impl Fn(&str) -> i64,
) -> Vec<Part> {
    let mut parts: BTreeMap<i64, Part> = BTreeMap::new();
    for (r, request) in requests.iter().enumerate() {
        if verdicts[r].is_err() {
            continue;
        }
        // This request's piece of each shard, in the request's order.
        let mut pieces: BTreeMap<i64, (Vec<Heartbeat>, Vec<usize>)> = BTreeMap::new();
        for (i, h) in request.iter().enumerate() {
            let piece = pieces.entry(shard_of(h.org_id.as_str())).or_default();
            piece.0.push(h.clone());
            piece.1.push(i);
        }
        for (shard, (beats, at)) in pieces {
            let part = parts.entry(shard).or_insert_with(|| Part {
                shard,
                requests: Vec::new(),
                origin: Vec::new(),
            });
            part.requests.push(beats);
            part.origin.push((r, at));
        }
    }
    parts.into_values().collect()
}

/// Each request's answer from its verdict and its parts' answers (`answers[p]` answers
/// `parts[p].requests`). A part refused after all (which orgs never deleted rule out)
/// refuses its request, naming the heartbeat in the whole request.
pub fn merge(
    requests: &[Vec<Heartbeat>],
    verdicts: Vec<Result<(), IngestReject>>,
    parts: &[Part],
    answers: Vec<Vec<RequestOutcome>>,
) -> Vec<RequestOutcome> {
    let mut whole: Vec<Result<Vec<Option<HeartbeatOutcome>>, IngestReject>> = verdicts
        .into_iter()
        .zip(requests)
        .map(|(v, r)| v.map(|()| vec![None; r.len()]))
        .collect();
    for (part, answers) in parts.iter().zip(answers) {
        for ((r, at), answer) in part.origin.iter().zip(answers) {
            let Ok(slots) = &mut whole[*r] else { continue };
            match answer {
                Ok(outcomes) => {
                    for (i, o) in at.iter().zip(outcomes) {
                        slots[*i] = Some(o);
                    }
                }
                Err(IngestReject::UnknownOrg { index, org_id }) => {
                    whole[*r] = Err(IngestReject::UnknownOrg {
                        index: at[index],
                        org_id,
                    });
                }
            }
        }
    }
    whole
        .into_iter()
        .map(|w| {
            w.map(|slots| {
                slots
                    .into_iter()
                    .map(|o| o.expect("every heartbeat of an accepted request has a part"))
                    .collect()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Id;
    use crate::ledger::{Observation, Phase, VmState};

    fn hb(org: &str, session: &str, seq: i64) -> Heartbeat {
        Heartbeat {
            org_id: Id::parse(org).unwrap(),
            session_id: Id::parse(session).unwrap(),
            vm_id: Id::parse("vm").unwrap(),
            obs: Observation {
                seq,
                at: 100 + seq,
                state: VmState::Running,
            },
            received_at: 100 + seq,
        }
    }

    /// What a store would answer a part: each heartbeat's org, session and seq in its
    /// outcome, so that a misplaced answer shows.
    fn answer(part: &Part) -> Vec<RequestOutcome> {
        part.requests
            .iter()
            .map(|r| {
                Ok(r.iter()
                    .map(|h| HeartbeatOutcome {
                        session_id: format!("{}#{}", h.session_id, h.obs.seq),
                        org_id: h.org_id.to_string(),
                        duplicate: false,
                        phase: Phase::Running,
                        members: Vec::new(),
                    })
                    .collect())
            })
            .collect()
    }

    fn shard(org: &str) -> i64 {
        i64::from(org.as_bytes()[0] % 3)
    }

    #[test]
    fn a_group_cut_by_shard_is_answered_in_each_requests_order() {
        let requests = vec![
            vec![hb("a", "s1", 1), hb("b", "s2", 1), hb("a", "s1", 2)],
            vec![hb("c", "s3", 1)],
            vec![hb("d", "s4", 1), hb("a", "s5", 1)],
        ];
        let found: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let verdicts = check(&requests, &found);
        let parts = split(&requests, &verdicts, shard);
        let shards: Vec<i64> = parts.iter().map(|p| p.shard).collect();
        assert_eq!(shards, vec![0, 1, 2]);
        for p in &parts {
            assert!(p
                .requests
                .iter()
                .flatten()
                .all(|h| shard(h.org_id.as_str()) == p.shard));
        }
        let answers = parts.iter().map(answer).collect();
        let merged = merge(&requests, verdicts, &parts, answers);
        for (request, outcome) in requests.iter().zip(&merged) {
            let named: Vec<String> = outcome
                .as_ref()
                .unwrap()
                .iter()
                .map(|o| format!("{}/{}", o.org_id, o.session_id))
                .collect();
            let asked: Vec<String> = request
                .iter()
                .map(|h| format!("{}/{}#{}", h.org_id, h.session_id, h.obs.seq))
                .collect();
            assert_eq!(named, asked);
        }
    }

    #[test]
    fn a_request_naming_an_unknown_org_is_refused_whole_and_has_no_part() {
        let requests = vec![
            vec![hb("a", "s1", 1), hb("x", "s2", 1)],
            vec![hb("b", "s3", 1)],
        ];
        let found: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let verdicts = check(&requests, &found);
        let parts = split(&requests, &verdicts, shard);
        assert!(parts
            .iter()
            .flat_map(|p| &p.requests)
            .flatten()
            .all(|h| h.org_id.as_str() == "b"));
        let answers = parts.iter().map(answer).collect();
        let merged = merge(&requests, verdicts, &parts, answers);
        assert_eq!(
            merged[0],
            Err(IngestReject::UnknownOrg {
                index: 1,
                org_id: "x".into()
            })
        );
        assert_eq!(merged[1].as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_part_refused_after_all_refuses_its_request_at_its_own_index() {
        let requests = vec![vec![hb("a", "s1", 1), hb("b", "s2", 1), hb("b", "s3", 1)]];
        let found: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let verdicts = check(&requests, &found);
        let parts = split(&requests, &verdicts, shard);
        let answers = parts
            .iter()
            .map(|p| {
                if p.requests[0][0].org_id.as_str() == "b" {
                    vec![Err(IngestReject::UnknownOrg {
                        index: 1,
                        org_id: "b".into(),
                    })]
                } else {
                    answer(p)
                }
            })
            .collect();
        let merged = merge(&requests, verdicts, &parts, answers);
        assert_eq!(
            merged[0],
            Err(IngestReject::UnknownOrg {
                index: 2,
                org_id: "b".into()
            })
        );
    }
}
