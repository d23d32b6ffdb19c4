//! Hostile input from schemathesis (PyPI): it reads `/openapi.json` from a running server
//! and sends every operation generated requests, valid and invalid, in two passes: one
//! with the ids it makes up, one with the path ids (and the gate's body ids) of an org,
//! key and session that exist, so that its cases reach past the 404s. The checks: no 5xx,
//! every status and content type documented, every body (errors too) matching its schema,
//! and requests that break the schema refused. Stripe is a stub here (localstripe has no
//! Checkout or portal). On SQLite and PostgreSQL; PostgreSQL's figures go to
//! reports/hostile-input.md.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{hb, Backend, Options, TestServer};
use rush_meter::config::StripeConfig;
use secrecy::SecretString;
use serde_json::json;

const SCHEMATHESIS: &str = "schemathesis==4.32.5";
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_schema_conformance,response_headers_conformance,\
                      negative_data_rejection";
const MAX_EXAMPLES: &str = "100";
const SEED: &str = "20261201";

/// Stripe's API as far as checkout and the portal go: a customer, a Checkout Session, a
/// portal session; counts what it was asked.
async fn stripe_stub() -> (String, Arc<AtomicU64>) {
    use axum::http::{Method, Uri};
    let calls = Arc::new(AtomicU64::new(0));
    let counter = calls.clone();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri| {
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        async move {
            let (status, body) = match (method.as_str(), uri.path()) {
                ("POST", "/v1/customers") => (200, json!({"id": format!("cus_stub{n}"), "object": "customer", "metadata": {}})),
                ("GET", "/v1/customers" | "/v1/customers/search" | "/v1/checkout/sessions") => (200, json!({"object": "list", "data": [], "has_more": false})),
                ("POST", "/v1/checkout/sessions") => (200, json!({"id": format!("cs_stub{n}"), "url": format!("https://checkout.stripe.test/{n}")})),
                ("POST", "/v1/billing_portal/sessions") => (200, json!({"id": format!("bps_stub{n}"), "url": "https://billing.stripe.test/session"})),
                _ => (404, json!({"error": {"type": "invalid_request_error", "message": "the stub has no such route"}})),
            };
            (axum::http::StatusCode::from_u16(status).unwrap(), axum::Json(body))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

/// An org with a key, a running session and an ended one.
async fn seed(srv: &TestServer) {
    srv.create_org("acme", "pro").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    for s in ["s1", "s2"] {
        let d = srv
            .admin(
                "POST",
                "/v1/admissions",
                Some(json!({"org_id": "acme", "key_id": "k1", "session_id": s, "agent": "claude"})),
            )
            .await;
        assert_eq!(d["decision"], "allow", "{d}");
    }
    let t = srv.clock.now();
    let (status, v) = srv
        .heartbeats(vec![
            hb("acme", "s1", 1, "running", t),
            hb("acme", "s2", 1, "running", t),
        ])
        .await;
    assert_eq!(status, 200, "{v}");
    srv.admin(
        "POST",
        "/v1/sessions/s2/end",
        Some(json!({"status": "completed"})),
    )
    .await;
}

struct Pass {
    name: &'static str,
    operations: u64,
    cases: u64,
    secs: f64,
}

/// The number before `word` on the line that has it (`927 generated`, `Tested: 25`).
fn figure(out: &str, word: &str) -> Option<u64> {
    out.lines().find_map(|l| {
        let i = l.find(word)?;
        let before = l[..i].trim_end().rsplit(' ').next()?;
        let after = l[i + word.len()..].trim_start().split(' ').next()?;
        before.parse().ok().or_else(|| after.parse().ok())
    })
}

/// One pass, with an admin token of its own: schemathesis may revoke the token it finds
/// (`POST /v1/tokens/{token_id}/revoke`), which must not be the harness's.
async fn pass(
    st: &std::path::Path,
    srv: &TestServer,
    name: &'static str,
    config: Option<&str>,
) -> Pass {
    let token = srv.token(&[rush_meter::tokens::Scope::Admin], None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(st);
    cmd.arg("--no-color");
    if let Some(toml) = config {
        let path = dir.path().join("schemathesis.toml");
        std::fs::write(&path, toml).unwrap();
        cmd.arg("--config-file").arg(path);
    }
    let started = std::time::Instant::now();
    let out = cmd
        .args([
            "run",
            &format!("{}/openapi.json", srv.url),
            "--url",
            &srv.url,
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["--checks", CHECKS, "--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", SEED])
        .args(["--generation-database", "none"])
        .current_dir(dir.path())
        .output()
        .await
        .expect("schemathesis runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // Exit status 0: every check passed on every case (1: a failure; 2: no test ran).
    assert!(
        out.status.success(),
        "schemathesis ({name}) found failures:\n{text}"
    );
    Pass {
        name,
        operations: figure(&text, "Tested:").expect("operations tested"),
        cases: figure(&text, "generated").expect("cases generated"),
        secs: started.elapsed().as_secs_f64(),
    }
}

every_backend!(schemathesis_finds_no_server_error_and_no_undocumented_answer);

async fn schemathesis_finds_no_server_error_and_no_undocumented_answer(backend: Backend) {
    let Some(st) = tokio::task::block_in_place(|| common::venv::tool("st", SCHEMATHESIS)) else {
        return;
    };
    let (stripe_url, stripe_calls) = stripe_stub().await;
    let opts = Options {
        stripe: StripeConfig {
            secret_key: Some(SecretString::from("sk_test_stub")),
            webhook_secrets: vec![SecretString::from("whsec_schemathesis")],
            api_base: stripe_url,
            ..StripeConfig::default()
        },
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    seed(&srv).await;
    // A token for the pass with real ids to revoke.
    let mut decoy = rush_meter::tokens::token_row(
        "decoy-secret-0123456789",
        &[rush_meter::tokens::Scope::Ingest],
        Some("acme"),
        "decoy",
        srv.clock.now(),
    );
    decoy.token_id = "tok_decoy".into();
    srv.db
        .insert_token(&decoy, &rush_meter_core::audit::Actor::system("test"))
        .await
        .unwrap();
    let pinned = r#"
[parameters]
"path.org_id" = "acme"
"path.key_id" = "k1"
"path.session_id" = "s1"
"body.org_id" = "acme"
"body.key_id" = "k1"
"path.token_id" = "tok_decoy"
"#;
    let passes = [
        pass(&st, &srv, "made-up ids", None).await,
        pass(&st, &srv, "ids that exist", Some(pinned)).await,
    ];
    // Every operation of the document was tried: none skipped or left out unnoticed.
    let documented = documented_operations(&srv).await;
    for p in &passes {
        assert_eq!(
            p.operations, documented,
            "schemathesis ({}) tested {} of the document's {documented} operations",
            p.name, p.operations
        );
    }
    // The server still answers, and its ledger is readable end to end (with a token made
    // now: schemathesis revokes the tokens it lists, the harness's among them).
    let token = srv.token(&[rush_meter::tokens::Scope::Admin], None).await;
    let (status, usage) = srv
        .call("GET", "/v1/orgs/acme/usage", Some(&token), None)
        .await;
    assert_eq!((status, &usage["org_id"]), (200, &json!("acme")), "{usage}");
    // Both backends take the same cases; the report is PostgreSQL's, production's database.
    if backend == Backend::Postgres {
        write_report(&passes, backend, stripe_calls.load(Ordering::Relaxed));
    }
}

/// Operations (a method on a path) in the served `/openapi.json`, but for that document's
/// own: schemathesis leaves out the URL it loads the schema from.
async fn documented_operations(srv: &TestServer) -> u64 {
    let doc: serde_json::Value = reqwest::get(format!("{}/openapi.json", srv.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];
    doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .filter(|(path, _)| *path != "/openapi.json")
        .map(|(_, item)| item)
        .map(|item| METHODS.iter().filter(|m| item.get(**m).is_some()).count() as u64)
        .sum()
}

fn write_report(passes: &[Pass], backend: Backend, stripe_calls: u64) {
    let rows: String = passes
        .iter()
        .map(|p| {
            format!(
                "| {} | {} | {} | 0 | {:.0} s |\n",
                p.name, p.operations, p.cases, p.secs
            )
        })
        .collect();
    let cases: u64 = passes.iter().map(|p| p.cases).sum();
    let md = format!(
        "# Hostile input\n\n\
         ## schemathesis against `/openapi.json`\n\n\
         - Command: `cargo test --test schemathesis` (run by `.ci/run`; it rewrites this section's figures)\n\
         - Tool: {SCHEMATHESIS}, seed {SEED}, `--max-examples {MAX_EXAMPLES}`, phases examples, coverage and fuzzing, valid and invalid data\n\
         - Server: one instance on {backend:?}, admin token, Stripe a stub ({stripe_calls} calls)\n\
         - Checks: {checks}\n\n\
         | pass | operations | cases | failures | time |\n| --- | --- | --- | --- | --- |\n{rows}\n\
         Each pass tried every operation of the document but `GET /openapi.json` (the URL\n\
         schemathesis loads it from); the test fails if one is skipped.\n\
         {cases} cases in all; 0 answered 5xx, 0 answered a status, type or body the document does not describe.\n",
        checks = CHECKS.replace(',', ", "),
    );
    std::fs::write(
        concat!(env!("CARGO_MANIFEST_DIR"), "/reports/hostile-input.md"),
        md,
    )
    .unwrap();
}
