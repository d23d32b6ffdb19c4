//! Black-box tests of the HTTP contract, each run on SQLite and on PostgreSQL.

mod common;

use common::*;
use rush_meter::tokens::Scope;
use serde_json::{json, Value};

fn field(v: &Value) -> Option<&str> {
    v["error"]["field"].as_str()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

every_backend! {
    async fn heartbeats_bill_running_time_and_never_parked_time(srv: TestServer) {
        srv.create_org("acme", "free").await;
        let t = T0;
        let mut seq = 0;
        // Running 60 s, parked 600 s, running 30 s, parked.
        for (state, at) in [("running", t), ("running", t + 15), ("running", t + 30),
                            ("running", t + 45), ("parked", t + 60), ("parked", t + 300),
                            ("parked", t + 660), ("running", t + 660), ("running", t + 675),
                            ("parked", t + 690)] {
            seq += 1;
            srv.clock.set(at);
            let (status, v) = srv.heartbeats(vec![hb("acme", "ses_1", seq, state, at)]).await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["results"][0]["accepted"], true);
            assert_eq!(v["results"][0]["action"], "continue");
        }
        srv.clock.set(t + 5000);
        let u = srv.usage("acme").await;
        assert_eq!(u["month"]["used_seconds"], 90, "{u}");
        assert_eq!(u["week"]["used_seconds"], 90);
        assert_eq!(u["month"]["limit_seconds"], 18_000);
        assert_eq!(u["month"]["remaining_seconds"], 18_000 - 90);
        assert_eq!(u["month"]["used_hours"], "0.0250");
        assert_eq!(u["month"]["limit_hours"], "5.0000");
        assert_eq!(u["month"]["start"], "2026-11-01T00:00:00Z");
        assert_eq!(u["month"]["end"], "2026-12-01T00:00:00Z");
        assert_eq!(u["week"]["start"], "2026-11-30T00:00:00Z");
        assert_eq!(u["week"]["resets_at"], "2026-12-07T00:00:00Z");
        assert_eq!(u["parked_sessions"], 1);
        assert_eq!(u["running_sessions"], 0);
        assert_eq!(u["plan"], "free");
    }

    async fn a_running_session_counts_up_to_now_at_most_one_interval_ahead(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.clock.set(T0);
        srv.heartbeats(vec![hb("acme", "s", 1, "running", T0)]).await;
        srv.clock.set(T0 + 10);
        assert_eq!(srv.usage("acme").await["month"]["used_seconds"], 10);
        assert_eq!(srv.usage("acme").await["running_sessions"], 1);
        srv.clock.set(T0 + 40);
        assert_eq!(srv.usage("acme").await["month"]["used_seconds"], 15);
        // Silent past the lease: billed one interval, and the expiry job books exactly that.
        srv.clock.set(T0 + 3600);
        assert_eq!(srv.db.expire_sessions(T0 + 3600, &srv.rules, &common::plans(), 100).await.unwrap(), 1);
        assert_eq!(srv.usage("acme").await["month"]["used_seconds"], 15);
        assert_eq!(srv.usage("acme").await["running_sessions"], 0);
        // It speaks again: the gap stays unbilled and the session is flagged.
        srv.heartbeats(vec![hb("acme", "s", 2, "running", T0 + 3600)]).await;
        srv.clock.set(T0 + 3615);
        srv.heartbeats(vec![hb("acme", "s", 3, "parked", T0 + 3615)]).await;
        assert_eq!(srv.usage("acme").await["month"]["used_seconds"], 30);
        let s = srv.admin("GET", "/v1/sessions/s", None).await;
        assert_eq!(s["flags"], json!(["unadmitted", "silent_gap"]));
        assert_eq!(s["billed_seconds"], 30);
    }

    async fn replayed_batches_change_nothing(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.clock.set(T0 + 20);
        let batch: Vec<Value> = (0..20).map(|i| hb("acme", &format!("s{}", i % 4), i / 4 + 1, "running", T0 + i / 4)).collect();
        let (status, first) = srv.heartbeats(batch.clone()).await;
        assert_eq!(status, 200, "{first}");
        let before = srv.db.digest().await.unwrap();
        let (status, again) = srv.heartbeats(batch).await;
        assert_eq!(status, 200);
        assert_eq!(srv.db.digest().await.unwrap(), before);
        assert!(again["results"].as_array().unwrap().iter().all(|r| r["duplicate"] == true && r["accepted"] == true));
        assert!(first["results"].as_array().unwrap().iter().all(|r| r["duplicate"] == false));
    }

    async fn an_overtaken_heartbeat_is_applied_in_order_within_a_lease_and_changes_nothing_after(srv: TestServer) {
        srv.create_org("acme", "free").await;
        // seq 3 overtakes seq 2: held, not applied, until 2 comes (within a lease of 3).
        srv.clock.set(T0 + 30);
        srv.heartbeats(vec![hb("acme", "s", 1, "running", T0), hb("acme", "s", 3, "running", T0 + 30)]).await;
        let (_, v) = srv.heartbeats(vec![hb("acme", "s", 2, "parked", T0 + 15)]).await;
        assert_eq!(v["results"][0]["duplicate"], false);
        // The parked stretch [T0 + 15, T0 + 30) is not billed.
        assert_eq!(srv.usage("acme").await["month"]["used_seconds"], 15);
        let timeline = srv.admin("GET", "/v1/sessions/s", None).await;
        assert_eq!((&timeline["running_seconds"], &timeline["parked_seconds"]), (&json!(15), &json!(15)), "{timeline}");
        // One that comes after the lease finds the held one applied: it changes nothing.
        srv.heartbeats(vec![hb("acme", "t", 1, "running", T0 + 30), hb("acme", "t", 3, "running", T0 + 30)]).await;
        srv.clock.set(T0 + 30 + 45);
        srv.db.expire_sessions(T0 + 30 + 45, &srv.rules, &common::plans(), 100).await.unwrap();
        let before = srv.db.digest().await.unwrap();
        let (_, v) = srv.heartbeats(vec![hb("acme", "t", 2, "parked", T0 + 30)]).await;
        assert_eq!(v["results"][0]["duplicate"], true);
        assert_eq!(srv.db.digest().await.unwrap(), before);
    }

    async fn bad_input_is_refused_whole_and_changes_nothing(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.create_org("other", "free").await;
        srv.clock.set(T0);
        srv.heartbeats(vec![hb("other", "taken", 1, "running", T0)]).await;
        srv.heartbeats(vec![hb("acme", "taken", 1, "running", T0)]).await;
        let console = srv.token(&[Scope::Console], Some("acme")).await;
        let reader = srv.token(&[Scope::Console], Some("other")).await;
        let before = srv.db.digest().await.unwrap();
        let good = hb("acme", "s1", 1, "running", T0);

        // 400: not JSON, wrong type (with the path of the field).
        let resp = srv.client.post(format!("{}/v1/heartbeats", srv.url)).bearer_auth(ADMIN)
            .header("content-type", "application/json").body("{\"heartbeats\": [").send().await.unwrap();
        assert_eq!(resp.status(), 400);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(code(&v), "malformed_body");
        let mut bad = good.clone();
        bad["seq"] = json!("seven");
        let (s, v) = srv.heartbeats(vec![good.clone(), bad]).await;
        assert_eq!((s, field(&v)), (400, Some("heartbeats[1].seq")), "{v}");

        // 401: no token, unknown token.
        let (s, v) = srv.call("POST", "/v1/heartbeats", None, Some(&json!({"heartbeats": [good]}))).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"));
        let (s, _) = srv.call("POST", "/v1/heartbeats", Some("rm_nope"), Some(&json!({"heartbeats": [good]}))).await;
        assert_eq!(s, 401);

        // 403: a console token cannot ingest or administer.
        let (s, v) = srv.call("POST", "/v1/heartbeats", Some(&console), Some(&json!({"heartbeats": [good]}))).await;
        assert_eq!((s, code(&v)), (403, "forbidden"), "{v}");
        let (s, _) = srv.call("PUT", "/v1/orgs/acme", Some(&console), Some(&json!({"plan": "pro"}))).await;
        assert_eq!(s, 403);

        // 404: unknown org in a batch (field named); another org's usage for a console token.
        let (s, v) = srv.heartbeats(vec![good.clone(), hb("ghost", "s2", 1, "running", T0)]).await;
        assert_eq!((s, code(&v), field(&v)), (404, "org_not_found", Some("heartbeats[1].org_id")), "{v}");
        let (s, v) = srv.call("GET", "/v1/orgs/acme/usage", Some(&reader), None).await;
        assert_eq!((s, code(&v)), (404, "org_not_found"));
        let (s, _) = srv.call("GET", "/v1/orgs/ghost/usage", Some(&reader), None).await;
        assert_eq!(s, 404);
        let (s, _) = srv.call("POST", "/v1/sessions/nope/end", Some(ADMIN), Some(&json!({"status": "completed"}))).await;
        assert_eq!(s, 404);

        // 409: a session named without its org (a deprecated route) whose id two orgs have.
        let (s, v) = srv.call("POST", "/v1/sessions/taken/end", Some(ADMIN), Some(&json!({"status": "completed"}))).await;
        assert_eq!((s, code(&v)), (409, "session_conflict"), "{v}");
        let (s, v) = srv.call("GET", "/v1/sessions/taken", Some(ADMIN), None).await;
        assert_eq!((s, code(&v)), (409, "session_conflict"), "{v}");

        // 413: a body over the limit.
        let huge = json!({"heartbeats": vec![good.clone(); 10_000]});
        let (s, v) = srv.call("POST", "/v1/heartbeats", Some(ADMIN), Some(&huge)).await;
        assert_eq!((s, code(&v)), (413, "body_too_large"), "{v}");

        // 422: values out of range, each naming its field.
        for (patch, name) in [
            (json!({"session_id": "bad id"}), "heartbeats[1].session_id"),
            (json!({"org_id": ""}), "heartbeats[1].org_id"),
            (json!({"vm_id": "x".repeat(65)}), "heartbeats[1].vm_id"),
            (json!({"state": "sleeping"}), "heartbeats[1].state"),
            (json!({"seq": -1}), "heartbeats[1].seq"),
            (json!({"sent_at": "yesterday"}), "heartbeats[1].sent_at"),
        ] {
            let mut bad = good.clone();
            for (k, v) in patch.as_object().unwrap() {
                bad[k] = v.clone();
            }
            let (s, v) = srv.heartbeats(vec![good.clone(), bad]).await;
            assert_eq!((s, code(&v), field(&v)), (422, "invalid_value", Some(name)), "{v}");
        }
        let (s, v) = srv.heartbeats(vec![]).await;
        assert_eq!((s, field(&v)), (422, Some("heartbeats")));
        let (s, v) = srv.heartbeats(vec![good.clone(); 1001]).await;
        assert_eq!((s, field(&v)), (422, Some("heartbeats")));
        let (s, v) = srv.call("PUT", "/v1/orgs/acme", Some(ADMIN), Some(&json!({"plan": "platinum"}))).await;
        assert_eq!((s, field(&v)), (422, Some("plan")));
        let (s, v) = srv.call("PUT", "/v1/orgs/acme/keys/k1", Some(ADMIN), Some(&json!({"concurrency_limit": 5}))).await;
        assert_eq!((s, field(&v)), (422, Some("concurrency_limit")), "{v}");
        let (s, v) = srv.call("PUT", "/v1/orgs/a%20b", Some(ADMIN), Some(&json!({}))).await;
        assert_eq!((s, field(&v)), (422, Some("org_id")));
        let (s, v) = srv.call("POST", "/v1/sessions/taken/end", Some(ADMIN), Some(&json!({"status": "done"}))).await;
        assert_eq!((s, field(&v)), (422, Some("status")));

        // Unknown routes and methods answer in the same format.
        let (s, v) = srv.call("GET", "/v1/nowhere", Some(ADMIN), None).await;
        assert_eq!((s, code(&v)), (404, "not_found"));
        let (s, v) = srv.call("DELETE", "/v1/heartbeats", Some(ADMIN), None).await;
        assert_eq!((s, code(&v)), (405, "method_not_allowed"));

        assert_eq!(srv.db.digest().await.unwrap(), before, "a refused request wrote something");
    }

    async fn sessions_end_once(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.clock.set(T0);
        srv.heartbeats(vec![hb("acme", "s", 1, "running", T0)]).await;
        srv.clock.set(T0 + 10);
        let v = srv.admin("POST", "/v1/sessions/s/end", Some(json!({"status": "completed"}))).await;
        assert_eq!(v["state"], "ended");
        assert_eq!(v["end_status"], "completed");
        assert_eq!(v["billed_seconds"], 10);
        let before = srv.db.digest().await.unwrap();
        srv.clock.set(T0 + 20);
        let again = srv.admin("POST", "/v1/sessions/s/end", Some(json!({"status": "failed"}))).await;
        assert_eq!(again["end_status"], "completed");
        assert_eq!(again["billed_seconds"], 10);
        // A heartbeat after the end bills nothing and tells the VM to stop.
        let (_, v) = srv.heartbeats(vec![hb("acme", "s", 2, "running", T0 + 20)]).await;
        assert_eq!(v["results"][0]["duplicate"], true);
        assert_eq!(v["results"][0]["action"], "park");
        assert_eq!(srv.db.digest().await.unwrap(), before);
    }

    async fn orgs_and_keys_round_trip(srv: TestServer) {
        let v = srv.admin("PUT", "/v1/orgs/acme", Some(json!({"name": "Acme", "plan": "pro"}))).await;
        assert_eq!((v["org_id"].as_str(), v["plan"].as_str(), v["name"].as_str()), (Some("acme"), Some("pro"), Some("Acme")));
        let v = srv.admin("GET", "/v1/orgs/acme", None).await;
        assert_eq!(v["plan"], "pro");
        assert_eq!(v["subscription"], Value::Null);
        let k = srv.admin("PUT", "/v1/orgs/acme/keys/key_1", Some(json!({}))).await;
        assert_eq!(k["concurrency_limit"], 4);
        let k = srv.admin("PUT", "/v1/orgs/acme/keys/key_1", Some(json!({"concurrency_limit": 10}))).await;
        assert_eq!(k["concurrency_limit"], 10);
        // A downgrade lowers the limit in force at once.
        srv.admin("PUT", "/v1/orgs/acme", Some(json!({"plan": "free"}))).await;
        let k = srv.admin("GET", "/v1/orgs/acme/keys/key_1", None).await;
        assert_eq!((k["concurrency_limit"].as_i64(), k["concurrency_limit_set"].as_i64()), (Some(4), Some(10)));
        let (s, _) = srv.call("PUT", "/v1/orgs/ghost/keys/k", Some(ADMIN), Some(&json!({}))).await;
        assert_eq!(s, 404);
        let team = srv.admin("PUT", "/v1/orgs/big", Some(json!({"plan": "team"}))).await;
        assert_eq!(team["name"], "big");
        let k = srv.admin("PUT", "/v1/orgs/big/keys/k", Some(json!({"concurrency_limit": 100}))).await;
        assert_eq!(k["concurrency_limit"], 100);
        // No body and a JSON `null` are both `{}`, as the document allows: an org keeps what
        // is left out, a key's limit left out is the plan's default.
        let (s, v) = srv.call("PUT", "/v1/orgs/big", Some(ADMIN), Some(&Value::Null)).await;
        assert_eq!((s, v["plan"].as_str(), v["name"].as_str()), (200, Some("team"), Some("big")), "{v}");
        let (s, v) = srv.call("PUT", "/v1/orgs/big/keys/k", Some(ADMIN), None).await;
        assert_eq!((s, v["concurrency_limit"].as_i64(), v["concurrency_limit_set"].as_i64()), (200, Some(4), None), "{v}");
    }

    async fn console_tokens_see_their_org_only(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.create_org("other", "free").await;
        srv.clock.set(T0);
        srv.heartbeats(vec![hb("other", "theirs", 1, "running", T0)]).await;
        let console = srv.token(&[Scope::Console], Some("acme")).await;
        let (s, v) = srv.call("GET", "/v1/orgs/acme/usage", Some(&console), None).await;
        assert_eq!(s, 200, "{v}");
        for path in ["/v1/orgs/other/usage", "/v1/orgs/other", "/v1/sessions/theirs"] {
            let (s, v) = srv.call("GET", path, Some(&console), None).await;
            assert_eq!(s, 404, "{path}: {v}");
            assert!(!v.to_string().contains("theirs\""), "{path} leaked: {v}");
        }
        let finance = srv.token(&[Scope::Finance], None).await;
        let (s, _) = srv.call("GET", "/v1/orgs/other/usage", Some(&finance), None).await;
        assert_eq!(s, 200);
    }

    async fn unadmitted_sessions_are_billed_and_flagged(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.clock.set(T0 + 15);
        srv.heartbeats(vec![hb("acme", "wild", 1, "running", T0), hb("acme", "wild", 2, "running", T0 + 15)]).await;
        let s = srv.admin("GET", "/v1/sessions/wild", None).await;
        assert_eq!(s["flags"], json!(["unadmitted"]));
        assert_eq!(s["state"], "running");
        assert_eq!(s["billed_seconds"], 15);
    }

    async fn running_sessions_are_told_to_park_at_the_ceiling(srv: TestServer) {
        srv.create_org("acme", "free").await;
        // Free: 2 h a week. Run 2 h in 15 s beats, each delivered at its own time.
        let mut last = Value::Null;
        for (seq, dt) in (0..=7200).step_by(15).enumerate() {
            srv.clock.set(T0 + dt);
            let (s, v) = srv.heartbeats(vec![hb("acme", "s", seq as i64 + 1, "running", T0 + dt)]).await;
            assert_eq!(s, 200, "{v}");
            if dt < 7200 {
                assert_eq!(v["results"][0]["action"], "continue", "at {dt}: {v}");
            }
            last = v;
        }
        assert_eq!(last["results"][0]["remaining_seconds"], 0, "{last}");
        assert_eq!(last["results"][0]["action"], "park");
        let u = srv.usage("acme").await;
        assert_eq!(u["week"]["used_seconds"], 7200);
        assert_eq!(u["week"]["remaining_seconds"], 0);
    }

    async fn operations_endpoints(srv: TestServer) {
        let (s, _) = srv.call("GET", "/healthz", None, None).await;
        assert_eq!(s, 200);
        let (s, v) = srv.call("GET", "/readyz", None, None).await;
        assert_eq!(s, 200, "{v}");
        srv.create_org("acme", "free").await;
        let resp = srv.client.get(format!("{}/metrics", srv.url)).send().await.unwrap();
        assert!(resp.headers().contains_key("content-type"));
        let text = resp.text().await.unwrap();
        assert!(text.contains("rush_meter_http_requests_total"), "{text}");
        assert!(text.contains("route=\"/v1/orgs/{org_id}\""), "{text}");
        let resp = srv.client.get(format!("{}/healthz", srv.url)).header("x-request-id", "abc123").send().await.unwrap();
        assert_eq!(resp.headers()["x-request-id"], "abc123");
        let resp = srv.client.get(format!("{}/healthz", srv.url)).send().await.unwrap();
        assert!(!resp.headers()["x-request-id"].is_empty());
    }

    async fn graceful_shutdown_loses_nothing_acknowledged(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.clock.set(T0);
        let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        // Eight supervisors send one heartbeat a request, each of a new session, until the
        // server goes away; it is stopped while they are mid-stream.
        let senders: Vec<_> = (0..8)
            .map(|w| {
                let (client, url, acked) = (srv.client.clone(), format!("{}/v1/heartbeats", srv.url), acked.clone());
                tokio::spawn(async move {
                    for i in 0.. {
                        let id = format!("s{w}_{i}");
                        let body = json!({"heartbeats": [hb("acme", &id, 1, "running", T0)]});
                        match client.post(&url).bearer_auth(ADMIN).json(&body).send().await {
                            Ok(r) if r.status() == 200 => acked.lock().unwrap().push(id),
                            _ => return i,
                        }
                    }
                    unreachable!("a sender stops when the server does")
                })
            })
            .collect();
        common::eventually(30, "the senders are acknowledged", || async { acked.lock().unwrap().len() >= 100 }).await;
        srv.stop().await;
        let mut sent = 0;
        for s in senders {
            sent += s.await.unwrap();
        }
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() >= 100, "{} acknowledged", acked.len());
        let (url, backend) = (srv.database_url.clone(), srv.backend);
        let db = rush_meter::store::Db::connect(&url, Default::default()).await.unwrap();
        let stored: std::collections::HashSet<String> =
            db.sessions_of_org("acme").await.unwrap().into_iter().map(|s| s.session_id).collect();
        let lost: Vec<&String> = acked.iter().filter(|s| !stored.contains(*s)).collect();
        assert!(lost.is_empty(), "{backend:?}: acknowledged but not stored: {lost:?}");
        eprintln!("{backend:?}: {} of {sent} acknowledged before shutdown, all stored", acked.len());
    }

    async fn a_session_parked_for_seven_days_ends_expired(srv: TestServer) {
        srv.create_org("acme", "free").await;
        srv.clock.set(T0);
        srv.heartbeats(vec![hb("acme", "s", 1, "running", T0)]).await;
        srv.clock.set(T0 + 10);
        srv.heartbeats(vec![hb("acme", "s", 2, "parked", T0 + 10)]).await;
        let week = 7 * 86_400;
        assert_eq!(srv.db.expire_sessions(T0 + 10 + week - 1, &srv.rules, &common::plans(), 100).await.unwrap(), 0);
        assert_eq!(srv.db.expire_sessions(T0 + 10 + week + 60, &srv.rules, &common::plans(), 100).await.unwrap(), 1);
        srv.clock.set(T0 + 10 + week + 60);
        let s = srv.admin("GET", "/v1/sessions/s", None).await;
        assert_eq!((s["state"].as_str(), s["end_status"].as_str()), (Some("ended"), Some("expired")));
        assert_eq!(s["ended_at"], rush_meter_core::time::format_rfc3339(T0 + 10 + week));
        assert_eq!(s["billed_seconds"], 10);
    }
}
