//! The console's breakdown agrees with the usage page to the second, by every grouping,
//! running sessions included.

mod common;

use common::{hb, TestServer, T0};
use serde_json::{json, Value};

every_backend! {
    async fn every_grouping_adds_up_to_the_usage_page(srv: TestServer) {
        srv.create_org("org_1", "pro").await;
        srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({}))).await;
        for (session, agent, project, user) in [("s1", "codex", Some("web"), "u1"), ("s2", "claude", None, "u2")] {
            let mut body = json!({"org_id": "org_1", "key_id": "k1", "session_id": session, "agent": agent, "started_by": user});
            if let Some(p) = project {
                body["project_id"] = json!(p);
            }
            srv.admin("POST", "/v1/admissions", Some(body)).await;
        }
        // s1 runs 50 minutes from T0 and parks; s2 runs from T0+30 min and is still running.
        let mut seq = std::collections::HashMap::new();
        for t in (0..=5400).step_by(15) {
            let at = T0 + t;
            srv.clock.set(at);
            let mut beats = Vec::new();
            for (session, from, to) in [("s1", 0, 3000), ("s2", 1800, 5400)] {
                if (from..=to).contains(&t) {
                    let n = seq.entry(session).or_insert(0);
                    *n += 1;
                    let state = if session == "s1" && t == to { "parked" } else { "running" };
                    beats.push(hb("org_1", session, *n, state, at));
                }
            }
            let (status, v) = srv.heartbeats(beats).await;
            assert_eq!(status, 200, "{v}");
        }
        srv.clock.set(T0 + 5410);
        let usage = srv.usage("org_1").await;
        let used = usage["month"]["used_seconds"].as_i64().unwrap();
        assert_eq!(used, 3000 + 3600 + 10, "s1 50 min, s2 60 min, and 10 s of s2 running now");

        let mut by = std::collections::HashMap::new();
        for g in ["hour", "day", "session", "project", "user", "agent"] {
            let v = srv.admin("GET", &format!("/v1/orgs/org_1/usage/breakdown?group_by={g}"), None).await;
            let rows: Vec<(Value, i64)> = v["rows"].as_array().unwrap().iter().map(|r| (r["key"].clone(), r["seconds"].as_i64().unwrap())).collect();
            assert_eq!(rows.iter().map(|r| r.1).sum::<i64>(), used, "{g}: {v}");
            assert_eq!(v["total"]["seconds"].as_i64(), Some(used), "{g}");
            assert_eq!(v["from"], "2026-11-01T00:00:00Z");
            by.insert(g, (rows, v));
        }
        assert_eq!(by["agent"].0, vec![(json!("claude"), 3610), (json!("codex"), 3000)]);
        assert_eq!(by["project"].0, vec![(Value::Null, 3610), (json!("web"), 3000)]);
        assert_eq!(by["user"].0, vec![(json!("u1"), 3000), (json!("u2"), 3610)]);
        assert_eq!(by["day"].0, vec![(json!("2026-11-30T00:00:00Z"), used)]);
        // 12:00: s1's 50 minutes and s2's first half hour; 13:00: s2's next half hour and
        // the 10 s it has run since its last beat.
        assert_eq!(by["hour"].0, vec![(json!("2026-11-30T12:00:00Z"), 3000 + 1800), (json!("2026-11-30T13:00:00Z"), 1800 + 10)]);
        // The ceilings of the windows the range touches: November, and the weeks of it.
        let v = &by["day"].1;
        let months: Vec<&Value> = v["ceilings"].as_array().unwrap().iter().filter(|c| c["window"] == "month").collect();
        assert_eq!(months.len(), 1);
        assert_eq!(months[0]["limit_seconds"].as_i64(), Some(40 * 3600));
        assert_eq!(v["ceilings"].as_array().unwrap().iter().filter(|c| c["window"] == "week").count(), 6);

        // The session list and each session's timeline agree with it too.
        let list = srv.admin("GET", "/v1/orgs/org_1/sessions", None).await;
        let ids: Vec<&str> = list["sessions"].as_array().unwrap().iter().map(|s| s["session_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["s1", "s2"]);
        let running = srv.admin("GET", "/v1/orgs/org_1/sessions?state=running", None).await;
        assert_eq!(running["sessions"].as_array().unwrap().len(), 1);
        assert_eq!(running["sessions"][0]["session_id"], "s2");
        let page = srv.admin("GET", "/v1/orgs/org_1/sessions?limit=1", None).await;
        assert_eq!(page["sessions"][0]["session_id"], "s1");
        let cursor = page["next_cursor"].as_str().unwrap().to_owned();
        let next = srv.admin("GET", &format!("/v1/orgs/org_1/sessions?limit=1&cursor={cursor}"), None).await;
        assert_eq!(next["sessions"][0]["session_id"], "s2");
        let mut running_total = 0;
        for (id, parked) in [("s1", 5410 - 3000), ("s2", 0)] {
            let d = srv.admin("GET", &format!("/v1/sessions/{id}"), None).await;
            assert_eq!(d["running_seconds"], d["billed_seconds"], "{id}: {d}");
            assert_eq!(d["parked_seconds"].as_i64(), Some(parked), "{id}: {d}");
            let last = d["timeline"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(last["open"], true, "{id}: {d}");
            running_total += d["running_seconds"].as_i64().unwrap();
        }
        assert_eq!(running_total, used);
        let d = srv.admin("GET", "/v1/sessions/s1", None).await;
        assert_eq!(d["timeline"][0], json!({"kind": "running", "start": "2026-11-30T12:00:00Z", "end": "2026-11-30T12:50:00Z", "open": false}));
        assert_eq!((d["agent"].as_str(), d["project_id"].as_str(), d["started_by"].as_str()), (Some("codex"), Some("web"), Some("u1")));
        let (status, v) = srv.call("GET", "/v1/orgs/org_1/sessions?state=asleep", Some(common::ADMIN), None).await;
        assert_eq!((status, v["error"]["field"].as_str()), (422, Some("state")), "{v}");

        // Bad input is refused, naming the field.
        for (q, field) in [("group_by=week", "group_by"), ("from=2026-11-30T12:30:00Z&to=2026-11-30T14:00:00Z", "from"), ("from=2026-11-30T14:00:00Z&to=2026-11-30T12:00:00Z", "from"), ("from=yesterday", "from")] {
            let (status, v) = srv.call("GET", &format!("/v1/orgs/org_1/usage/breakdown?{q}"), Some(common::ADMIN), None).await;
            assert_eq!((status, v["error"]["field"].as_str()), (422, Some(field)), "{q}: {v}");
        }
    }

    // The usage page and the breakdown read their windows' figures beside the org's row,
    // from the billing period they last saw it with: when Stripe renews or starts a
    // period meanwhile, the very next read follows it.
    async fn the_windows_follow_a_new_billing_period_at_once(srv: TestServer) {
        srv.create_org("org_1", "pro").await;
        srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({}))).await;
        srv.admin("POST", "/v1/admissions", Some(json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex"}))).await;
        for (n, t) in (0..=3600).step_by(15).enumerate() {
            srv.clock.set(T0 + t);
            let (status, v) = srv.heartbeats(vec![hb("org_1", "s1", n as i64 + 1, "running", T0 + t)]).await;
            assert_eq!(status, 200, "{v}");
        }
        // A calendar month: seen (and remembered) as such.
        let (month, from, total) = read(&srv).await;
        assert_eq!((month["start"].as_str(), month["used_seconds"].as_i64()), (Some("2026-11-01T00:00:00Z"), Some(3600)));
        assert_eq!((from.as_str(), total.as_i64()), (Some("2026-11-01T00:00:00Z"), Some(3600)));
        // Stripe's period from 12:30 that day: half the hour is before it.
        srv.set_billing_period("org_1", T0 + 1800, T0 + 30 * 86_400).await;
        for _ in 0..2 {
            let (month, from, total) = read(&srv).await;
            assert_eq!((month["start"].as_str(), month["used_seconds"].as_i64()), (Some("2026-11-30T12:30:00Z"), Some(1800)));
            assert_eq!((from.as_str(), total.as_i64()), (Some("2026-11-30T12:00:00Z"), Some(3600)), "whole hours from the period's");
        }
    }
}

/// The usage page's month, and the day breakdown's start and total. The breakdown by
/// funding (whose funding rollup is also read for the period guessed, and again when the
/// org's row says otherwise) must cover the same range, all of it paid by the plan.
async fn read(srv: &TestServer) -> (Value, Value, Value) {
    let usage = srv.usage("org_1").await;
    let day = srv
        .admin("GET", "/v1/orgs/org_1/usage/breakdown?group_by=day", None)
        .await;
    let funding = srv
        .admin(
            "GET",
            "/v1/orgs/org_1/usage/breakdown?group_by=funding",
            None,
        )
        .await;
    let total = &day["total"]["seconds"];
    assert_eq!(
        (
            &funding["from"],
            &funding["rows"][0]["key"],
            &funding["rows"][0]["seconds"]
        ),
        (&day["from"], &json!("plan"), total),
        "{funding}"
    );
    (usage["month"].clone(), day["from"].clone(), total.clone())
}
