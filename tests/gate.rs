//! The gate over HTTP, on SQLite and PostgreSQL: exact concurrency under a burst, slots
//! released by park, end and silence, ceilings, suspension, and the decision record.

mod common;

use common::*;
use rush_meter::tokens::Scope;
use rush_meter_core::gate::{AdmissionRequest, Agent};
use serde_json::{json, Value};

async fn admit(srv: &TestServer, org: &str, key: &str, session: &str) -> (u16, Value) {
    srv.call(
        "POST",
        "/v1/admissions",
        Some(ADMIN),
        Some(
            &json!({"org_id": org, "key_id": key, "session_id": session, "agent": "claude",
                     "project_id": "web", "started_by": "user_7"}),
        ),
    )
    .await
}

async fn setup(srv: &TestServer, plan: &str, limit: i64) {
    srv.create_org("acme", plan).await;
    srv.admin(
        "PUT",
        "/v1/orgs/acme/keys/k1",
        Some(json!({"concurrency_limit": limit})),
    )
    .await;
}

every_backend! {
    // A session holding one key's slot asked for under another moves to it, counted once
    // (the first key has room again); a session running without an admission, asked for,
    // takes a slot of the key it is asked for under, within the key's limit.
    async fn a_session_asked_for_under_another_key_is_counted_once(srv: TestServer) {
        srv.clock.set(T0);
        srv.create_org("acme", "team").await;
        for key in ["k1", "k2"] {
            srv.admin("PUT", &format!("/v1/orgs/acme/keys/{key}"), Some(json!({"concurrency_limit": 1}))).await;
        }
        assert_eq!(admit(&srv, "acme", "k1", "a").await.1["decision"], "allow");
        let (_, moved) = admit(&srv, "acme", "k2", "a").await;
        assert_eq!((&moved["decision"], &moved["rule"], &moved["concurrency"]["running"]),
            (&json!("allow"), &json!("within_limits"), &json!(1)), "{moved}");
        let (_, b) = admit(&srv, "acme", "k1", "b").await;
        assert_eq!(b["decision"], "allow", "k1's slot left with a: {b}");
        let (_, c) = admit(&srv, "acme", "k2", "c").await;
        assert_eq!(c["reason"], "concurrency_limit_reached", "{c}");
        // Unadmitted and running, then asked for under k3: it takes k3's one slot.
        srv.admin("PUT", "/v1/orgs/acme/keys/k3", Some(json!({"concurrency_limit": 1}))).await;
        let (status, _) = srv.heartbeats(vec![hb("acme", "u", 1, "running", T0)]).await;
        assert_eq!(status, 200);
        let (_, u) = admit(&srv, "acme", "k3", "u").await;
        assert_eq!((&u["decision"], &u["concurrency"]["running"]), (&json!("allow"), &json!(1)), "{u}");
        let (_, v) = admit(&srv, "acme", "k3", "v").await;
        assert_eq!(v["reason"], "concurrency_limit_reached", "{v}");
    }

    // A session id is its org's own: two orgs naming one new id in a group, or one after
    // the other, make two sessions, each decided and billed as its org's.
    async fn two_orgs_naming_one_session_id_make_two_sessions(srv: TestServer) {
        srv.clock.set(T0);
        for org in ["acme", "beta"] {
            srv.create_org(org, "team").await;
            srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({}))).await;
        }
        srv.admin("PUT", "/v1/orgs/acme", Some(json!({"suspended": true}))).await;
        let plans = rush_meter::config::load_plans(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/plans"
        )))
        .unwrap();
        let request = |org: &str| AdmissionRequest {
            org_id: org.into(),
            key_id: "k1".into(),
            session_id: "shared".into(),
            agent: Agent::Claude,
            project_id: None,
            started_by: None,
        };
        // One group: acme first (suspended, so denied), then beta, then acme again.
        let group = [request("acme"), request("beta"), request("acme")];
        let answers = srv.db.admit(&plans, &group, T0, &srv.rules).await.unwrap();
        let verdict = |i: usize| answers[i].as_ref().map(|d| d.decision.as_str());
        assert_eq!(verdict(0), Ok("deny"));
        assert_eq!(verdict(1), Ok("allow"));
        assert_eq!(verdict(2), Ok("deny"), "acme is still suspended: beta's session is not its");
        assert_eq!(srv.db.sessions_of_org("acme").await.unwrap().len(), 0);
        let (status, v) = srv.heartbeats(vec![hb("beta", "shared", 1, "running", T0)]).await;
        assert_eq!(status, 200, "{v}");
        srv.admin("PUT", "/v1/orgs/acme", Some(json!({"suspended": false}))).await;
        let (status, v) = admit(&srv, "acme", "k1", "shared").await;
        assert_eq!((status, v["decision"].as_str()), (200, Some("allow")), "{v}");
        srv.clock.set(T0 + 60);
        let (status, v) = srv
            .heartbeats(vec![
                hb("acme", "shared", 1, "running", T0 + 30),
                hb("acme", "shared", 2, "running", T0 + 45),
                hb("acme", "shared", 3, "parked", T0 + 60),
            ])
            .await;
        assert_eq!(status, 200, "{v}");
        let acme = srv.admin("GET", "/v1/orgs/acme/sessions/shared", None).await;
        let beta = srv.admin("GET", "/v1/orgs/beta/sessions/shared", None).await;
        assert_eq!((acme["org_id"].as_str(), acme["state"].as_str()), (Some("acme"), Some("parked")), "{acme}");
        assert_eq!((beta["org_id"].as_str(), beta["state"].as_str()), (Some("beta"), Some("running")), "{beta}");
        assert_eq!(acme["billed_seconds"], 30, "acme's session bills its own heartbeats only: {acme}");
    }

    async fn a_group_of_orgs_on_other_billing_periods_reads_each_its_own_windows_and_limits(srv: TestServer) {
        // Orgs whose months differ are read apart (on one PostgreSQL, the first of them in
        // the statement that claims the group's ids, the rest in statements of their own):
        // each must come out with its own window, use and members' use.
        srv.clock.set(T0);
        let anchor = T0 - 10 * 86_400 + 7 * 3_600;
        for org in ["acme", "beta"] {
            srv.create_org(org, "team").await;
            srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({}))).await;
        }
        let state = |_: &rush_meter_core::org::Org| {
            Some(rush_meter::store::SubscriptionState {
                org_id: "beta".into(),
                plan_id: "team".into(),
                plan_version: 1,
                customer_id: "cus_beta".into(),
                subscription_id: Some("sub_beta".into()),
                status: Some("active".into()),
                period_start: Some(anchor),
                period_end: Some(anchor + 30 * 86_400),
                cancel_at_period_end: false,
                past_due_since: None,
                synced_at: T0,
                ticket: None,
            })
        };
        let applied = srv.db.apply_subscription_state("beta", &state, "test", T0).await.unwrap();
        assert!(applied.is_some(), "beta's billing period was not applied");
        // Each org's session of project web runs for 60 s (acme) and 90 s (beta), then parks.
        for (org, running) in [("acme", 4), ("beta", 6)] {
            let body = json!({"org_id": org, "key_id": "k1", "session_id": format!("{org}-1"),
                "agent": "codex", "project_id": "web"});
            let (status, v) = srv.call("POST", "/v1/admissions", Some(ADMIN), Some(&body)).await;
            assert_eq!((status, v["decision"].as_str()), (200, Some("allow")), "{v}");
            let session = format!("{org}-1");
            for i in 0..=running {
                let (state, at) = (if i < running { "running" } else { "parked" }, T0 + 15 * i);
                srv.clock.set(at);
                let (status, v) = srv.heartbeats(vec![hb(org, &session, i + 1, state, at)]).await;
                assert_eq!(status, 200, "{v}");
            }
            srv.clock.set(T0);
            let (status, v) = srv
                .call("PUT", &format!("/v1/orgs/{org}/limits/project/web"), Some(ADMIN),
                    Some(&json!({"monthly_hours": "0.01"})))
                .await;
            assert_eq!(status, 200, "{v}");
        }
        let plans = rush_meter::config::load_plans(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/plans"
        )))
        .unwrap();
        let request = |org: &str, project: &str| AdmissionRequest {
            org_id: org.into(),
            key_id: "k1".into(),
            session_id: format!("{org}-{project}"),
            agent: Agent::Claude,
            project_id: Some(project.into()),
            started_by: None,
        };
        let now = T0 + 90;
        let group = [request("acme", "web"), request("beta", "web"), request("beta", "api")];
        let answers = srv.db.admit(&plans, &group, now, &srv.rules).await.unwrap();
        let d: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
        let month = rush_meter_core::time::calendar_month(now);
        let summary = |d: &rush_meter_core::gate::Decision| {
            let reason = d.reason.map(|r| r.as_str().to_owned());
            (d.org_id.clone(), d.decision.as_str().to_owned(), reason, d.month_start, d.month_used)
        };
        assert_eq!(
            d.iter().map(summary).collect::<Vec<_>>(),
            vec![
                ("acme".into(), "deny".into(), Some("project_ceiling_reached".into()), month.start, 60),
                ("beta".into(), "deny".into(), Some("project_ceiling_reached".into()), anchor, 90),
                ("beta".into(), "allow".into(), None, anchor, 90),
            ]
        );
        let limit = |d: &rush_meter_core::gate::Decision| {
            d.limit.as_ref().map(|l| (l.member_id.clone(), l.month_used))
        };
        assert_eq!(limit(&d[0]), Some(("web".to_string(), 60)));
        assert_eq!(limit(&d[1]), Some(("web".to_string(), 90)));
    }

    async fn a_burst_of_2000_admits_exactly_the_limit(srv: TestServer) {
        setup(&srv, "team", 100).await;
        srv.clock.set(T0);
        let mut tasks = Vec::new();
        for i in 0..2000 {
            let (client, url) = (srv.client.clone(), format!("{}/v1/admissions", srv.url));
            tasks.push(tokio::spawn(async move {
                let body = json!({"org_id": "acme", "key_id": "k1", "session_id": format!("s{i}"), "agent": "codex"});
                let r = client.post(url).bearer_auth(ADMIN).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap())
            }));
        }
        let (mut allowed, mut denied) = (0, 0);
        for t in tasks {
            let (status, v) = t.await.unwrap();
            assert_eq!(status, 200, "{v}");
            match v["decision"].as_str() {
                Some("allow") => allowed += 1,
                Some("deny") => {
                    assert_eq!(v["reason"], "concurrency_limit_reached");
                    assert_eq!(v["concurrency"]["running"], 100);
                    denied += 1
                }
                _ => panic!("{v}"),
            }
        }
        assert_eq!((allowed, denied), (100, 1900));
    }

    async fn a_slot_comes_back_on_park_end_and_silence(srv: TestServer) {
        setup(&srv, "free", 2).await;
        srv.clock.set(T0);
        assert_eq!(admit(&srv, "acme", "k1", "a").await.1["decision"], "allow");
        assert_eq!(admit(&srv, "acme", "k1", "b").await.1["decision"], "allow");
        let (_, v) = admit(&srv, "acme", "k1", "c").await;
        assert_eq!((v["decision"].as_str(), v["reason"].as_str()), (Some("deny"), Some("concurrency_limit_reached")));
        // Repeating an admitted session's call answers the same and takes no second slot.
        let (_, v) = admit(&srv, "acme", "k1", "a").await;
        assert_eq!((v["decision"].as_str(), v["rule"].as_str()), (Some("allow"), Some("already_admitted")));
        assert_eq!(v["concurrency"]["running"], 2);
        // a runs then parks: its slot comes back.
        srv.heartbeats(vec![hb("acme", "a", 1, "running", T0)]).await;
        srv.clock.set(T0 + 10);
        srv.heartbeats(vec![hb("acme", "a", 2, "parked", T0 + 10)]).await;
        assert_eq!(admit(&srv, "acme", "k1", "c").await.1["decision"], "allow");
        // Resuming the parked session passes the same gate: full now.
        let (_, v) = admit(&srv, "acme", "k1", "a").await;
        assert_eq!(v["reason"], "concurrency_limit_reached");
        // b ends: its slot comes back, and a resumes.
        srv.admin("POST", "/v1/sessions/b/end", Some(json!({"status": "completed"}))).await;
        assert_eq!(admit(&srv, "acme", "k1", "a").await.1["decision"], "allow");
        // c and a go silent (c never sent a heartbeat): both slots come back after the lease.
        srv.clock.set(T0 + 10 + 46);
        assert_eq!(admit(&srv, "acme", "k1", "d").await.1["decision"], "allow");
        assert_eq!(admit(&srv, "acme", "k1", "e").await.1["decision"], "allow");
        assert_eq!(admit(&srv, "acme", "k1", "f").await.1["reason"], "concurrency_limit_reached");
    }

    async fn ceilings_deny_with_an_upgrade_and_a_plan_change_applies_at_once(srv: TestServer) {
        setup(&srv, "free", 4).await;
        // Free: 2 h a week. Run 2 h.
        srv.clock.set(T0);
        assert_eq!(admit(&srv, "acme", "k1", "s1").await.1["decision"], "allow");
        for (seq, dt) in (0..=7200).step_by(15).enumerate() {
            srv.clock.set(T0 + dt);
            srv.heartbeats(vec![hb("acme", "s1", seq as i64 + 1, "running", T0 + dt)]).await;
        }
        srv.heartbeats(vec![hb("acme", "s1", 7200 / 15 + 2, "parked", T0 + 7200)]).await;
        let before = srv.db.sessions_of_org("acme").await.unwrap();
        let (_, v) = admit(&srv, "acme", "k1", "s2").await;
        assert_eq!((v["decision"].as_str(), v["reason"].as_str()), (Some("deny"), Some("weekly_ceiling_reached")), "{v}");
        assert_eq!(v["usage"]["week"]["remaining_seconds"], 0);
        assert_eq!(v["usage"]["week"]["resets_at"], "2026-12-07T00:00:00Z");
        assert_eq!(v["usage"]["month"]["used_seconds"], 7200);
        assert_eq!(v["upgrade"]["plan"], "pro");
        // Denials consume nothing: no session, no slot.
        assert_eq!(srv.db.sessions_of_org("acme").await.unwrap(), before);
        // Resuming the parked session is refused by the same ceiling.
        assert_eq!(admit(&srv, "acme", "k1", "s1").await.1["reason"], "weekly_ceiling_reached");
        srv.admin("PUT", "/v1/orgs/acme", Some(json!({"plan": "pro"}))).await;
        let (_, v) = admit(&srv, "acme", "k1", "s2").await;
        assert_eq!((v["decision"].as_str(), v["plan"].as_str()), (Some("allow"), Some("pro")), "{v}");
        srv.admin("PUT", "/v1/orgs/acme", Some(json!({"suspended": true}))).await;
        let (_, v) = admit(&srv, "acme", "k1", "s3").await;
        assert_eq!(v["reason"], "org_suspended");
        assert!(v.get("upgrade").is_none(), "{v}");
    }

    async fn every_decision_is_recorded_and_readable(srv: TestServer) {
        setup(&srv, "free", 1).await;
        srv.create_org("other", "free").await;
        for (i, t) in [T0, T0 + 10, T0 + 20, T0 + 30].iter().enumerate() {
            srv.clock.set(*t);
            admit(&srv, "acme", "k1", &format!("s{i}")).await;
        }
        let page = srv.admin("GET", "/v1/orgs/acme/decisions?limit=2", None).await;
        let list = page["decisions"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["decision"], "allow");
        assert_eq!(list[1]["reason"], "concurrency_limit_reached");
        assert_eq!(list[1]["concurrency"], json!({"running": 1, "limit": 1}));
        assert_eq!(list[1]["as_of"], "2026-11-30T12:00:10Z");
        let cursor = page["next_cursor"].as_str().unwrap();
        let next = srv.admin("GET", &format!("/v1/orgs/acme/decisions?limit=2&cursor={cursor}"), None).await;
        assert_eq!(next["decisions"].as_array().unwrap().len(), 2);
        let denies = srv.admin("GET", "/v1/orgs/acme/decisions?decision=deny&from=2026-11-30T12:00:15Z&to=2026-11-30T13:00:00Z", None).await;
        assert_eq!(denies["decisions"].as_array().unwrap().len(), 2);
        assert_eq!(denies["next_cursor"], Value::Null);
        let console = srv.token(&[Scope::Console], Some("acme")).await;
        let (s, _) = srv.call("GET", "/v1/orgs/acme/decisions", Some(&console), None).await;
        assert_eq!(s, 200);
        let theirs = srv.token(&[Scope::Console], Some("other")).await;
        let (s, _) = srv.call("GET", "/v1/orgs/acme/decisions", Some(&theirs), None).await;
        assert_eq!(s, 404);
        let (s, v) = srv.call("GET", "/v1/orgs/acme/decisions?decision=maybe", Some(ADMIN), None).await;
        assert_eq!((s, v["error"]["field"].as_str()), (422, Some("decision")));
    }

    async fn admission_errors_name_the_field_and_change_nothing(srv: TestServer) {
        setup(&srv, "free", 4).await;
        srv.create_org("other", "free").await;
        srv.clock.set(T0);
        srv.heartbeats(vec![hb("other", "theirs", 1, "running", T0)]).await;
        admit(&srv, "acme", "k1", "done").await;
        srv.admin("POST", "/v1/sessions/done/end", Some(json!({"status": "cancelled"}))).await;
        let ingest = srv.token(&[Scope::Ingest], None).await;
        let before = srv.db.digest().await.unwrap();
        let (s, v) = admit(&srv, "acme", "nokey", "x").await;
        assert_eq!((s, v["error"]["code"].as_str(), v["error"]["field"].as_str()), (404, Some("key_not_found"), Some("key_id")));
        let (s, v) = admit(&srv, "ghost", "k1", "x").await;
        assert_eq!((s, v["error"]["field"].as_str()), (404, Some("org_id")));
        let (s, v) = admit(&srv, "acme", "k1", "done").await;
        assert_eq!((s, v["error"]["code"].as_str()), (409, Some("session_ended")));
        let (s, v) = srv.call("POST", "/v1/admissions", Some(ADMIN),
            Some(&json!({"org_id": "acme", "key_id": "k1", "session_id": "x", "agent": "gpt"}))).await;
        assert_eq!((s, v["error"]["field"].as_str()), (422, Some("agent")));
        let (s, _) = srv.call("POST", "/v1/admissions", Some(&ingest),
            Some(&json!({"org_id": "acme", "key_id": "k1", "session_id": "x", "agent": "codex"}))).await;
        assert_eq!(s, 403);
        assert_eq!(srv.db.digest().await.unwrap(), before);
    }

    async fn running_sessions_overshoot_the_ceiling_by_at_most_one_interval_each(srv: TestServer) {
        // Free: 2 h a week, grace 0. Four sessions run into the ceiling; each parks when a
        // heartbeat answer says so. Bound (docs/gate.md): grace + sessions x interval.
        setup(&srv, "free", 4).await;
        srv.clock.set(T0);
        let sessions = ["a", "b", "c", "d"];
        for s in sessions {
            assert_eq!(admit(&srv, "acme", "k1", s).await.1["decision"], "allow");
        }
        run_together_until_parked(&srv, "acme", &sessions, T0).await;
        let used = srv.usage("acme").await["week"]["used_seconds"].as_i64().unwrap();
        assert!(used >= 7200, "the ceiling was reached: {used}");
        assert!(used <= 7200 + 4 * 15, "overshoot {} s is past the bound of 60 s", used - 7200);
        // And nothing new starts.
        assert_eq!(admit(&srv, "acme", "k1", "e").await.1["reason"], "weekly_ceiling_reached");
    }

    async fn a_session_running_across_window_boundaries_is_split_exactly(srv: TestServer) {
        setup(&srv, "team", 10).await;
        let at = |t: &str| rush_meter_core::time::rfc3339::parse(t).unwrap();
        // (start, end) of a run, and the windows it crosses, read just after it.
        for (name, start, end) in [
            ("newyear", "2026-12-31T23:59:30Z", "2027-01-01T00:00:30Z"),
            ("leap", "2028-02-29T23:59:45Z", "2028-03-01T00:00:15Z"),
            ("feb", "2027-02-28T23:59:50Z", "2027-03-01T00:00:10Z"),
            ("monday", "2027-03-07T23:59:40Z", "2027-03-08T00:00:20Z"),
        ] {
            let (s, e) = (at(start), at(end));
            // One org a case, so that each window holds one run.
            srv.create_org(name, "team").await;
            let mut seq = 0;
            for t in (s..e).step_by(15) {
                seq += 1;
                srv.clock.set(t);
                srv.heartbeats(vec![hb(name, name, seq, "running", t)]).await;
            }
            srv.clock.set(e);
            srv.heartbeats(vec![hb(name, name, seq + 1, "parked", e)]).await;
            let u = srv.usage(name).await;
            let month_start = at(u["month"]["start"].as_str().unwrap());
            let week_start = at(u["week"]["start"].as_str().unwrap());
            // Only the part after each window's start counts in it.
            let in_month = e - s.max(month_start);
            let in_week = e - s.max(week_start);
            assert_eq!(u["month"]["used_seconds"].as_i64().unwrap(), in_month, "{name}: {u}");
            assert_eq!(u["week"]["used_seconds"].as_i64().unwrap(), in_week, "{name}: {u}");
        }
        // The ISO week of 31 Dec 2026 spans two months (and years): 28 Dec to 4 Jan.
        srv.clock.set(at("2027-01-02T00:00:00Z"));
        let u = srv.usage("newyear").await;
        assert_eq!(u["week"]["start"], "2026-12-28T00:00:00Z");
        assert_eq!(u["week"]["used_seconds"], 60);
        assert_eq!(u["month"]["used_seconds"], 30);
    }

    async fn a_host_clock_running_late_does_not_free_slots(srv: TestServer) {
        setup(&srv, "free", 1).await;
        srv.clock.set(T0);
        assert_eq!(admit(&srv, "acme", "k1", "a").await.1["decision"], "allow");
        // The supervisor's clock is 44 s behind the meter's: its beats are timed at the edge
        // of the lease, yet the session is heard from now, and keeps its slot.
        for (seq, dt) in [(1, 0), (2, 15), (3, 30)] {
            srv.clock.set(T0 + dt);
            srv.heartbeats(vec![hb("acme", "a", seq, "running", T0 + dt - 44)]).await;
        }
        srv.clock.set(T0 + 40);
        assert_eq!(admit(&srv, "acme", "k1", "b").await.1["reason"], "concurrency_limit_reached");
        assert_eq!(srv.usage("acme").await["running_sessions"], 1);
    }

    // A turn shorter than a second: admitted and parked within the same second of the
    // meter's clock (a parked session's slot is judged by whole seconds). Parked, it holds
    // no slot, so the next session is admitted at once, not after the lease; resumed in
    // that second again, it holds one again.
    async fn a_session_parked_in_the_second_it_was_admitted_gives_its_slot_back(srv: TestServer) {
        setup(&srv, "free", 1).await;
        srv.clock.set(T0);
        assert_eq!(admit(&srv, "acme", "k1", "a").await.1["decision"], "allow");
        srv.heartbeats(vec![hb("acme", "a", 1, "running", T0)]).await;
        srv.heartbeats(vec![hb("acme", "a", 2, "parked", T0)]).await;
        let (_, b) = admit(&srv, "acme", "k1", "b").await;
        assert_eq!(b["decision"], "allow", "{b}");
        assert_eq!(b["concurrency"]["running"], 1, "{b}");
        srv.heartbeats(vec![hb("acme", "b", 1, "parked", T0)]).await;
        assert_eq!(admit(&srv, "acme", "k1", "a").await.1["decision"], "allow");
        assert_eq!(admit(&srv, "acme", "k1", "c").await.1["reason"], "concurrency_limit_reached");
    }

    // The gate's transactions keep generic plans on one PostgreSQL (`begin_hot`), remade
    // only when a table is analyzed: a hot table filling from empty is analyzed again as
    // it grows, not left with the statistics of its first hundred rows until autovacuum.
    async fn a_hot_table_that_outgrew_its_statistics_gets_new_ones(srv: TestServer) {
        let rush_meter::store::Pools::Postgres(pool) = srv.db.pools() else {
            // SQLite plans without statistics: there is never anything to gather.
            assert!(srv.db.gather_statistics().await.unwrap());
            return;
        };
        let relkind: i8 = sqlx::query_scalar("SELECT relkind FROM pg_class WHERE relname = 'api_keys'")
            .fetch_one(pool)
            .await
            .unwrap();
        if common::citus::coordinator().is_some() {
            // The coordinator holds no rows: each worker's autovacuum analyzes its shards.
            assert!(srv.db.gather_statistics().await.unwrap(), "on Citus the job has nothing to do");
            return;
        }
        if relkind == b'p' as i8 {
            // Partitioned by org: every statement is planned for its values (`begin_hot`).
            return;
        }
        srv.create_org("acme", "team").await;
        let mut conn = pool.acquire().await.unwrap();
        let mut planned_on = Vec::new();
        for (from, to) in [(0, 150), (150, 2_000)] {
            sqlx::query(
                "INSERT INTO api_keys (org_id, key_id, created_at, updated_at) \
                 SELECT 'acme', 'bulk' || n, 0, 0 FROM generate_series($1, $2 - 1) AS n",
            )
            .bind(from)
            .bind(to)
            .execute(&mut *conn)
            .await
            .unwrap();
            // Counted in pg_stat_user_tables now (this call's end reports the insert), not
            // at the backend's next report a second or more away.
            sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut *conn).await.unwrap();
            assert!(!srv.db.gather_statistics().await.unwrap(), "PostgreSQL keeps watching");
            let tuples: f32 = sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'api_keys'")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            planned_on.push(tuples);
        }
        assert_eq!(planned_on, vec![150.0, 2_000.0], "the planner's row count after each step");
    }

}

/// A decision that waits for its key's lock reads the org after the wait: a suspension
/// (or a plan change) committed meanwhile applies to it, never the org from before (which
/// a read in the statement that waited would return). PostgreSQL only: on SQLite a writer
/// holds the database's write lock throughout its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_waiting_for_its_keys_lock_reads_the_org_committed_meanwhile() {
    for (change, want) in [
        (
            json!({"suspended": true}),
            ("deny", Some("org_suspended"), "team"),
        ),
        (json!({"plan": "free"}), ("allow", None, "free")),
    ] {
        let Some(srv) = TestServer::start(Backend::Postgres).await else {
            return;
        };
        srv.clock.set(T0);
        setup(&srv, "team", 4).await;
        let rush_meter::store::Pools::Postgres(pool) = srv.db.pools() else {
            unreachable!("a PostgreSQL server")
        };
        let mut holder = pool.begin().await.unwrap();
        sqlx::query("SELECT key_id FROM api_keys WHERE org_id = $1 AND key_id = $2 FOR UPDATE")
            .bind("acme")
            .bind("k1")
            .execute(&mut *holder)
            .await
            .unwrap();
        let change_then_release = async {
            eventually(30, "the admission waits for the key's lock", || async {
                sqlx::query_scalar::<_, i64>(
                    "SELECT COUNT(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(pool)
                .await
                .unwrap()
                    > 0
            })
            .await;
            srv.admin("PUT", "/v1/orgs/acme", Some(change.clone()))
                .await;
            holder.commit().await.unwrap();
        };
        let ((status, v), ()) = tokio::join!(admit(&srv, "acme", "k1", "s1"), change_then_release);
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            (
                v["decision"].as_str(),
                v["reason"].as_str(),
                v["plan"].as_str()
            ),
            (Some(want.0), want.1, Some(want.2)),
            "after {change}: {v}"
        );
        srv.finish().await;
    }
}
