//! Usage-threshold notifications: signed, recorded once per threshold per window (also
//! across a restart), retried with backoff while the receiver fails, delivered once it
//! recovers.

mod common;

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use common::{hb, Backend, Options, TestServer, T0};
use rush_meter::config::NotifyConfig;
use serde_json::{json, Value};

const SECRET: &str = "notify-secret-0123456789";

#[derive(Clone, Debug)]
struct Received {
    id: String,
    body: Value,
    signed_at: i64,
}

/// A receiver that answers 500 to its first `fail` requests and 200 after, checking
/// every signature.
async fn receiver(fail: usize) -> (String, Arc<Mutex<Vec<Received>>>) {
    let got: Arc<Mutex<Vec<Received>>> = Arc::default();
    let seen = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let seen = Arc::clone(&seen);
            async move {
                let header = headers
                    .get("rush-signature")
                    .map(|v| v.to_str().unwrap().to_owned());
                let signed_at = rush_meter_core::signature::verify(
                    header.as_deref(),
                    &body,
                    &[SECRET.to_owned()],
                    chrono::Utc::now().timestamp(),
                    300,
                )
                .expect("every notification is signed with the secret");
                let id = headers["rush-notification-id"].to_str().unwrap().to_owned();
                let body: Value = serde_json::from_slice(&body).unwrap();
                let mut seen = seen.lock().unwrap();
                seen.push(Received {
                    id,
                    body,
                    signed_at,
                });
                if seen.len() <= fail {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

fn options(url: &str) -> Options {
    Options {
        notify: Some(NotifyConfig {
            url: url.to_owned(),
            secret: secrecy::SecretString::from(SECRET),
        }),
        ..Options::default()
    }
}

async fn notifications(srv: &TestServer) -> Vec<Value> {
    srv.admin("GET", "/v1/admin/notifications?org_id=org_1", None)
        .await["notifications"]
        .as_array()
        .unwrap()
        .clone()
}

async fn state_of(srv: &TestServer, window: &str, threshold: i64) -> Option<(String, i64)> {
    notifications(srv)
        .await
        .iter()
        .find(|n| n["window"] == window && n["threshold_percent"] == threshold)
        .map(|n| {
            (
                n["state"].as_str().unwrap().to_owned(),
                n["attempts"].as_i64().unwrap(),
            )
        })
}

/// Runs org_1's one session, beating every 15 s, over `(from, to]` seconds after T0.
async fn run(srv: &TestServer, seq: &mut i64, from: i64, to: i64) {
    let mut t = from + 15;
    while t <= to {
        srv.clock.set(T0 + t);
        *seq += 1;
        let (status, v) = srv
            .heartbeats(vec![hb("org_1", "s1", *seq, "running", T0 + t)])
            .await;
        assert_eq!(status, 200, "{v}");
        t += 15;
    }
}

async fn a_threshold_notifies_once_and_is_retried_until_delivered(backend: Backend) {
    let (url, got) = receiver(2).await;
    let Some(srv) = TestServer::start_with(backend, options(&url)).await else {
        return;
    };
    // Free: 2 h a week (T0 is Monday noon), 5 h a month; thresholds 80% and 100%.
    srv.create_org("org_1", "free").await;
    srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({})))
        .await;
    srv.admin("POST", "/v1/admissions", Some(json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex", "started_by": "u1"}))).await;
    let mut seq = 0;
    run(&srv, &mut seq, -15, 5745).await;
    assert!(
        notifications(&srv).await.is_empty(),
        "79.8% of the week crosses nothing"
    );
    assert!(got.lock().unwrap().is_empty());

    // 5760 s is 80% of the week: recorded, sent, refused by the receiver.
    run(&srv, &mut seq, 5745, 5760).await;
    common::eventually(10, "the first try", || async {
        got.lock().unwrap().len() == 1
    })
    .await;
    common::eventually(10, "the failure recorded", || async {
        state_of(&srv, "week", 80).await == Some(("pending".into(), 1))
    })
    .await;
    // Retries wait for the backoff, on the meter's clock: 10 s, then 20 s.
    srv.clock.set(T0 + 5770);
    common::eventually(10, "the second try", || async {
        got.lock().unwrap().len() == 2
    })
    .await;
    common::eventually(10, "the second failure recorded", || async {
        state_of(&srv, "week", 80).await == Some(("pending".into(), 2))
    })
    .await;
    srv.clock.set(T0 + 5790);
    common::eventually(10, "delivered once the receiver recovers", || async {
        state_of(&srv, "week", 80).await == Some(("sent".into(), 3))
    })
    .await;

    // 100% of the week: a second notification, delivered at the first try.
    run(&srv, &mut seq, 5790 - 15, 7200).await;
    common::eventually(10, "the 100% notification sent", || async {
        state_of(&srv, "week", 100).await == Some(("sent".into(), 1))
    })
    .await;

    // A restarted instance sees both crossings again (its memory is new) and records
    // neither; it records the month's 80% (4 h of 5) when that comes.
    let srv = srv.restart(options(&url)).await;
    run(&srv, &mut seq, 7200, 14_400).await;
    common::eventually(10, "the month's 80% sent", || async {
        state_of(&srv, "month", 80).await == Some(("sent".into(), 1))
    })
    .await;
    let all = notifications(&srv).await;
    assert_eq!(all.len(), 3, "{all:?}");
    let received = got.lock().unwrap().clone();
    let ids: Vec<(&str, i64, &str)> = received
        .iter()
        .map(|r| {
            (
                r.body["window"].as_str().unwrap(),
                r.body["threshold_percent"].as_i64().unwrap(),
                r.id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        ids.len(),
        5,
        "three tries of the week's 80%, one of 100%, one of the month's 80%: {ids:?}"
    );
    assert!(
        ids[..3]
            .iter()
            .all(|x| (x.0, x.1) == ("week", 80) && x.2 == ids[0].2),
        "{ids:?}"
    );
    assert_eq!((ids[3].0, ids[3].1), ("week", 100));
    assert_eq!((ids[4].0, ids[4].1), ("month", 80));
    let first = &received[0];
    assert_eq!(first.body["id"], first.id.as_str());
    assert_eq!(first.body["org_id"], "org_1");
    assert_eq!(
        (
            first.body["plan"].as_str(),
            first.body["plan_version"].as_i64()
        ),
        (Some("free"), Some(1))
    );
    assert_eq!(first.body["window_start"], "2026-11-30T00:00:00Z");
    assert_eq!(first.body["limit_seconds"], 7200);
    assert_eq!(first.body["used_seconds"], 5760);
    assert_eq!(first.body["type"], "usage.threshold_crossed");
    assert_eq!(
        received[1].body, first.body,
        "every try sends the recorded body"
    );
    assert!(received.iter().all(|r| r.signed_at > 0));
}

every_backend!(a_threshold_notifies_once_and_is_retried_until_delivered);

/// The `org.room_restored` notifications received so far.
fn restored(got: &Mutex<Vec<Received>>) -> Vec<Received> {
    got.lock()
        .unwrap()
        .iter()
        .filter(|r| r.body["kind"] == "org.room_restored")
        .cloned()
        .collect()
}

/// A session told to park at the week's ceiling learns why and when the week resets; the
/// usage page counts it as parked for room; a grant brings room back, and one signed
/// `org.room_restored` names what did, the session parked, and the room by source.
async fn room_restored_is_notified_once_with_what_brought_it(backend: Backend) {
    let (url, got) = receiver(0).await;
    let Some(srv) = TestServer::start_with(backend, options(&url)).await else {
        return;
    };
    srv.create_org("org_1", "free").await;
    srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({})))
        .await;
    srv.admin(
        "POST",
        "/v1/admissions",
        Some(json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex"})),
    )
    .await;
    let mut seq = 0;
    // Free's week is 2 h, with no grace: the beat that reaches it is told to park.
    run(&srv, &mut seq, -15, 7185).await;
    let at = T0 + 7200;
    srv.clock.set(at);
    seq += 1;
    let (_, v) = srv
        .heartbeats(vec![hb("org_1", "s1", seq, "running", at)])
        .await;
    let r = &v["results"][0];
    assert_eq!(
        (
            r["action"].as_str(),
            r["park_reason"].as_str(),
            r["resume_at"].as_str()
        ),
        (
            Some("park"),
            Some("weekly_ceiling"),
            Some("2026-12-07T00:00:00Z")
        ),
        "{v}"
    );
    seq += 1;
    srv.clock.set(at + 5);
    let (_, v) = srv
        .heartbeats(vec![hb("org_1", "s1", seq, "parked", at + 5)])
        .await;
    assert_eq!(v["results"][0]["park_reason"], "weekly_ceiling", "{v}");
    let u = srv.usage("org_1").await;
    assert_eq!(
        (u["parked_sessions"].as_i64(), u["parked_for_room"].as_i64()),
        (Some(1), Some(1)),
        "{u}"
    );
    // No room restored while the org has none (its thresholds are notified meanwhile).
    let restored_so_far = || restored(&got);
    assert!(restored_so_far().is_empty());

    // A grant: room again, once.
    srv.admin(
        "POST",
        "/v1/orgs/org_1/grants",
        Some(json!({"seconds": 600, "kind": "make_good"})),
    )
    .await;
    common::eventually(30, "org.room_restored is delivered", || async {
        !restored_so_far().is_empty()
    })
    .await;
    let u = srv.usage("org_1").await;
    assert_eq!(u["parked_for_room"].as_i64(), Some(0), "{u}");
    // Recorded once: the wait it ended is gone, so no later scan finds it.
    let recorded = srv
        .admin("GET", "/v1/admin/notifications?org_id=org_1", None)
        .await;
    let kinds = recorded["notifications"].as_array().unwrap();
    assert_eq!(
        kinds
            .iter()
            .filter(|n| n["window"] == "room_restored")
            .count(),
        1,
        "{recorded}"
    );
    let restored = restored_so_far();
    assert_eq!(restored.len(), 1, "{restored:?}");
    let b = &restored[0].body;
    assert_eq!(
        (b["org_id"].as_str(), b["reason"].as_str()),
        (Some("org_1"), Some("grant")),
        "{b}"
    );
    assert_eq!(b["sessions"], json!(["s1"]));
    assert_eq!(
        (
            b["remaining_seconds"]["grant"].as_i64(),
            b["remaining_seconds"]["plan"].as_i64()
        ),
        (Some(600), Some(0)),
        "{b}"
    );
    assert_eq!(b["id"], restored[0].id.as_str());
}

every_backend!(room_restored_is_notified_once_with_what_brought_it);

/// A session parked at a limit inside its org (its user's week spent) waits for room too:
/// raising the limit brings it back, and `org.room_restored` says so (`limit_changed`).
async fn a_limit_raised_restores_room_to_its_members(backend: Backend) {
    let (url, got) = receiver(0).await;
    let Some(srv) = TestServer::start_with(backend, options(&url)).await else {
        return;
    };
    srv.create_org("org_1", "free").await;
    srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({})))
        .await;
    let limit = |weekly: &'static str| {
        let srv = &srv;
        async move {
            srv.admin(
                "PUT",
                "/v1/orgs/org_1/limits/user/u1",
                Some(json!({"monthly_hours": "5", "weekly_hours": weekly})),
            )
            .await
        }
    };
    limit("0.01").await;
    srv.admin(
        "POST",
        "/v1/admissions",
        Some(
            json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex",
                    "started_by": "u1"}),
        ),
    )
    .await;
    // The user's 36 s are spent in the third beat: it is told to park, for its limit.
    let mut seq = 0;
    run(&srv, &mut seq, -15, 30).await;
    let at = T0 + 45;
    srv.clock.set(at);
    seq += 1;
    let (_, v) = srv
        .heartbeats(vec![hb("org_1", "s1", seq, "running", at)])
        .await;
    let r = &v["results"][0];
    assert_eq!(
        (r["action"].as_str(), r["park_reason"].as_str()),
        (Some("park"), Some("member_limit")),
        "{v}"
    );
    seq += 1;
    srv.heartbeats(vec![hb("org_1", "s1", seq, "parked", at)])
        .await;
    assert!(restored(&got).is_empty());
    limit("1").await;
    common::eventually(30, "org.room_restored is delivered", || async {
        !restored(&got).is_empty()
    })
    .await;
    let b = &restored(&got)[0].body;
    assert_eq!(
        (b["reason"].as_str(), &b["sessions"]),
        (Some("limit_changed"), &json!(["s1"])),
        "{b}"
    );
}

every_backend!(a_limit_raised_restores_room_to_its_members);

/// However many instances find an org's room back at once, its wait ends once and one
/// notification is recorded: the wait's row is taken in the transaction that records it.
async fn a_wait_for_room_ends_once_however_many_race_for_it(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    srv.create_org("org_1", "free").await;
    let wait = rush_meter::store::RoomWait {
        org_id: "org_1".into(),
        since: T0,
        reason: "weekly_ceiling".into(),
        resume_at: T0 + 86_400,
        plan_id: "free".into(),
        plan_version: 1,
        members: None,
    };
    srv.db.note_room_wait(&wait).await.unwrap();
    // Noted again (another instance, a later heartbeat): still the one wait.
    let later = rush_meter::store::RoomWait {
        since: T0 + 60,
        ..wait.clone()
    };
    srv.db.note_room_wait(&later).await.unwrap();
    assert_eq!(srv.db.room_waits(None, 10).await.unwrap(), vec![wait]);
    let racers = (0..8).map(|_| {
        let db = srv.db.clone();
        tokio::spawn(async move {
            db.end_room_wait("org_1", T0, "room_restored:org_1:1", "{}", T0 + 10)
                .await
                .unwrap()
        })
    });
    let mut ended = 0;
    for r in racers {
        ended += usize::from(r.await.unwrap());
    }
    assert_eq!(ended, 1, "one of the racers ends the wait");
    assert!(srv.db.room_waits(None, 10).await.unwrap().is_empty());
    let recorded = srv
        .db
        .list_notifications(Some("org_1"), None, 10)
        .await
        .unwrap();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
}

every_backend!(a_wait_for_room_ends_once_however_many_race_for_it);
