//! Sessions as a supervisor runs them: its heartbeats, and runs that beat until an answer
//! says park.

use rush_meter_core::time::Secs;
use serde_json::{json, Value};

use super::{TestServer, T0};

/// A heartbeat as a supervisor sends it, `sent_at` as RFC 3339.
pub fn hb(org: &str, session: &str, seq: i64, state: &str, at: Secs) -> Value {
    json!({"org_id": org, "session_id": session, "vm_id": format!("vm_{session}"),
           "seq": seq, "state": state, "sent_at": rush_meter_core::time::format_rfc3339(at)})
}

/// Beat `session` of `org` every 15 s from `from`, moving the server's clock along, until
/// an answer says `park`; then park it there, at the time returned. Panics if no answer
/// says `park` within an hour.
pub async fn beat_until_told_to_park(
    srv: &TestServer,
    org: &str,
    session: &str,
    from: Secs,
) -> Secs {
    let run = run_until_parked(&[srv], org, &[session], from, Pace::Together).await;
    // The round it parked in.
    run.end - Pace::Together.tick()
}

/// Turn on `org`'s pay-as-you-go under a 0.10 cap, admit session `s1` on key `k1`, and
/// run it until it is told to park (on `mini`: past the week's 180 s and the cap's 100 s
/// of pay-as-you-go), from `from`.
pub async fn run_past_the_plan_to_the_cap(srv: &TestServer, org: &str, from: Secs) -> Secs {
    srv.admin(
        "PUT",
        &format!("/v1/orgs/{org}/overage"),
        Some(json!({"enabled": true, "monthly_cap": "0.10"})),
    )
    .await;
    let d = srv.admit(org, "k1", "s1").await;
    assert_eq!(d["decision"], "allow", "{d}");
    beat_until_told_to_park(srv, org, "s1", from).await
}

/// What a run until parked saw: how many sessions were told to park, the least
/// `remaining_seconds` an answer gave, and the meter time it ended at (a round past the
/// one in which the last session parked).
pub struct Parked {
    pub told: usize,
    pub least_remaining: i64,
    pub end: Secs,
}

/// When the sessions of a run until parked beat: each every 15 s, all in the same second
/// or each at its own offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pace {
    /// All at once, in one batch, every 15 s.
    Together,
    /// Session `i` at `2 i` s past each 15 s (mod 15), so that up to 15 sessions never
    /// beat in the same second.
    Staggered,
}

impl Pace {
    /// Whether session `i` beats `since` seconds into the run.
    fn due(self, i: usize, since: Secs) -> bool {
        match self {
            Pace::Together => since % 15 == 0,
            Pace::Staggered => since % 15 == (i as i64 * 2) % 15,
        }
    }

    /// How far meter time moves from one round to the next.
    fn tick(self) -> Secs {
        match self {
            Pace::Together => 15,
            Pace::Staggered => 1,
        }
    }
}

/// `sessions` of `org` (admitted already), beating from `from` at `pace` and parking as
/// soon as an answer says so, through `servers` in turn (the sessions due at one time on
/// one server in one batch), all on one meter time. A session never told to park within
/// an hour fails the test.
async fn run_until_parked<S: AsRef<str>>(
    servers: &[&TestServer],
    org: &str,
    sessions: &[S],
    from: Secs,
    pace: Pace,
) -> Parked {
    let n = sessions.len();
    let mut seq = vec![0i64; n];
    let mut parked = vec![false; n];
    let mut out = Parked {
        told: 0,
        least_remaining: i64::MAX,
        end: from,
    };
    let mut t = from;
    while parked.iter().any(|p| !p) {
        assert!(t < from + 3600, "sessions never told to park");
        for s in servers {
            s.clock.set(t);
        }
        for (k, server) in servers.iter().enumerate() {
            let due: Vec<usize> = (0..n)
                .filter(|&i| !parked[i] && pace.due(i, t - from))
                .filter(|&i| (t as usize + i) % servers.len() == k)
                .collect();
            if due.is_empty() {
                continue;
            }
            let beats = due
                .iter()
                .map(|&i| {
                    seq[i] += 1;
                    hb(org, sessions[i].as_ref(), seq[i], "running", t)
                })
                .collect();
            let (status, v) = server.heartbeats(beats).await;
            assert_eq!(status, 200, "{v}");
            // One result a heartbeat, in order.
            for (&i, answer) in due.iter().zip(v["results"].as_array().unwrap()) {
                out.least_remaining = out
                    .least_remaining
                    .min(answer["remaining_seconds"].as_i64().unwrap());
                if answer["action"] == "park" {
                    out.told += 1;
                    seq[i] += 1;
                    let (status, v) = server
                        .heartbeats(vec![hb(org, sessions[i].as_ref(), seq[i], "parked", t)])
                        .await;
                    assert_eq!(status, 200, "{v}");
                    parked[i] = true;
                }
            }
        }
        t += pace.tick();
    }
    out.end = t;
    out
}

/// `sessions` of `org` (admitted already) on `srv`, all beating every 15 s from `from` in
/// one batch, each parking as soon as an answer says so; returns the meter time 15 s past
/// the last park. A session never told to park within an hour fails the test.
pub async fn run_together_until_parked(
    srv: &TestServer,
    org: &str,
    sessions: &[&str],
    from: Secs,
) -> Secs {
    run_until_parked(&[srv], org, sessions, from, Pace::Together)
        .await
        .end
}

/// `sessions` of `org` (admitted already), each beating every 15 s from `T0` at its own
/// offset and parking as soon as an answer says so, through `servers` in turn, all on one
/// meter time. A session never told to park within an hour fails the test.
pub async fn run_staggered_until_parked(
    servers: &[&TestServer],
    org: &str,
    sessions: &[String],
) -> Parked {
    run_until_parked(servers, org, sessions, T0, Pace::Staggered).await
}
