//! The upgrade prompt: thresholds, projection, the plan it suggests and how to get it.

mod common;

use common::{hb, TestServer, T0};
use serde_json::json;

every_backend! {
    async fn the_prompt_shows_past_a_threshold_with_a_plan_that_fits(srv: TestServer) {
        srv.create_org("org_1", "free").await;
        srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({"concurrency_limit": 1}))).await;
        let quiet = srv.admin("GET", "/v1/orgs/org_1/upgrade-prompt", None).await;
        assert_eq!((quiet["show"].as_bool(), quiet["reasons"].as_array().map(Vec::len)), (Some(false), Some(0)), "{quiet}");
        assert!(quiet["suggested_plan"].is_null() && quiet["checkout"].is_null());

        srv.admin("POST", "/v1/admissions", Some(json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex"}))).await;
        // 100 minutes on Monday 2026-11-30 from 12:00: 83% of Free's 2 h week.
        for (n, t) in (0..=6000).step_by(15).enumerate() {
            srv.clock.set(T0 + t);
            let (status, v) = srv.heartbeats(vec![hb("org_1", "s1", n as i64 + 1, "running", T0 + t)]).await;
            assert_eq!(status, 200, "{v}");
        }
        let v = srv.admin("GET", "/v1/orgs/org_1/upgrade-prompt", None).await;
        assert_eq!(v["show"], true, "{v}");
        assert_eq!(v["reasons"], json!([{"kind": "usage", "window": "week", "percent": 80}]));
        let week = &v["projection"]["week"];
        assert_eq!(week["used_seconds"].as_i64(), Some(6000));
        // 6,000 s in the 49,200 s since Monday 00:00; 555,600 s of the week to go.
        assert_eq!(week["projected_seconds"].as_i64(), Some(6000 + 6000 * 555_600 / 49_200));
        assert_eq!(week["ceiling_at"], "2026-11-30T16:24:00Z");
        // Pro's 15 h week would not hold 20.5 h: Team.
        assert_eq!(v["suggested_plan"]["id"], "team");
        assert_eq!(v["checkout"], json!({"method": "POST", "path": "/v1/orgs/org_1/checkout", "body": {"plan": "team"}}));

        // A run refused for the key's limit adds its reason.
        let (status, d) = srv
            .call("POST", "/v1/admissions", Some(common::ADMIN), Some(&json!({"org_id": "org_1", "key_id": "k1", "session_id": "s2", "agent": "codex"})))
            .await;
        assert_eq!((status, d["reason"].as_str()), (200, Some("concurrency_limit_reached")), "{d}");
        let v = srv.admin("GET", "/v1/orgs/org_1/upgrade-prompt", None).await;
        assert_eq!(v["reasons"][1], json!({"kind": "concurrency_denials", "count": 1}));
    }
}
