//! A sweep of every route with the tokens that must not reach another org's data: none, an
//! unknown one, a console token of another org, each scope the route does not grant, and a
//! token of every scope bound to another org. Each answer must be a refusal in the error
//! format, the same as for an org (or session, or token) that does not exist, so that it
//! reveals nothing; and nothing may be written.

mod common;

use common::{hb, Backend, TestServer, T0};
use rush_meter::tokens::Scope;
use serde_json::{json, Value};

struct Route {
    method: &'static str,
    /// `{org}`, `{session}` and `{token}` (a token bound to the org) are filled in.
    path: &'static str,
    body: fn(&str, &str) -> Option<Value>,
    /// Unbound scopes that may use the route for any org; `Console` too where the route
    /// shows a token nothing but itself (`/v1/me`).
    grants: &'static [Scope],
}

fn none(_: &str, _: &str) -> Option<Value> {
    None
}

const ROUTES: &[Route] = &[
    Route {
        method: "GET",
        path: "/v1/me",
        body: none,
        grants: &Scope::ALL,
    },
    Route {
        method: "GET",
        path: "/v1/me/usage",
        body: none,
        grants: &[Scope::Member],
    },
    Route {
        method: "GET",
        path: "/v1/tokens?org_id={org}",
        body: none,
        grants: &[],
    },
    Route {
        method: "POST",
        path: "/v1/tokens",
        body: |org, _| Some(json!({"scopes": ["ingest"], "org_id": org, "label": "x"})),
        grants: &[],
    },
    Route {
        method: "POST",
        path: "/v1/tokens/{token}/revoke",
        body: none,
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs?q=org",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "PUT",
        path: "/v1/orgs/{org}",
        body: |_, _| Some(json!({"plan": "team"})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "PUT",
        path: "/v1/orgs/{org}/keys/k1",
        body: |_, _| Some(json!({"concurrency_limit": 9})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/keys/k1",
        body: none,
        grants: &[Scope::Admission],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/usage",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/grants",
        body: |_, _| Some(json!({"seconds": 3600, "kind": "promo"})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/grants",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/grants/grt_1/void",
        body: none,
        grants: &[],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/topups",
        body: |_, _| Some(json!({"hours": 5})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/overage",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "PUT",
        path: "/v1/orgs/{org}/overage",
        body: |_, _| Some(json!({"enabled": false})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/overage/charges",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/overage/charges/retry",
        body: none,
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/auto-topup",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "PUT",
        path: "/v1/orgs/{org}/auto-topup",
        body: |_, _| Some(json!({"enabled": false})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/limits",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "PUT",
        path: "/v1/orgs/{org}/limits/project/web",
        body: |_, _| Some(json!({"weekly_hours": "1"})),
        grants: &[],
    },
    Route {
        method: "DELETE",
        path: "/v1/orgs/{org}/limits/project/web",
        body: none,
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/audit",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/audit",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/decisions",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/heartbeats",
        body: |org, session| {
            Some(json!({"heartbeats": [hb(org, session, 99, "running", T0 + 30)]}))
        },
        grants: &[Scope::Ingest],
    },
    Route {
        method: "POST",
        path: "/v1/admissions",
        body: |org, session| {
            Some(json!({"org_id": org, "key_id": "k1", "session_id": session, "agent": "codex"}))
        },
        grants: &[Scope::Admission],
    },
    Route {
        method: "GET",
        path: "/v1/sessions/{session}",
        body: none,
        grants: &[Scope::Ingest, Scope::Admission, Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/sessions/{session}/end",
        body: |_, _| Some(json!({"status": "completed"})),
        grants: &[Scope::Ingest, Scope::Admission],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/sessions/{session}",
        body: none,
        grants: &[Scope::Ingest, Scope::Admission, Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/sessions/{session}/end",
        body: |_, _| Some(json!({"status": "completed"})),
        grants: &[Scope::Ingest, Scope::Admission],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/checkout",
        body: |_, _| Some(json!({"plan": "team"})),
        grants: &[],
    },
    Route {
        method: "POST",
        path: "/v1/orgs/{org}/billing-portal",
        body: none,
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/usage/breakdown?group_by=session",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/sessions",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/invoice-preview",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/orgs/{org}/upgrade-prompt",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/exports/usage?period=2026-11&by=session",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "GET",
        path: "/v1/periods",
        body: none,
        grants: &[Scope::Finance],
    },
    Route {
        method: "POST",
        path: "/v1/periods/2026-10/close",
        body: none,
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/admin/notifications?org_id={org}",
        body: none,
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/plans",
        body: none,
        grants: &[],
    },
    Route {
        method: "POST",
        path: "/v1/plans/pro/migrations",
        body: |_, _| Some(json!({"from": 1, "to": 1, "at": "now", "dry_run": true})),
        grants: &[],
    },
    Route {
        method: "GET",
        path: "/v1/admin/stripe/events",
        body: none,
        grants: &[],
    },
    Route {
        method: "POST",
        path: "/v1/admin/stripe/events/evt_1/retry",
        body: none,
        grants: &[],
    },
];

async fn refusal(
    srv: &TestServer,
    r: &Route,
    token: Option<&str>,
    org: &str,
    session: &str,
) -> (u16, String) {
    let path = fill(r.path, org, session);
    let (status, v) = srv
        .call(r.method, &path, token, (r.body)(org, session).as_ref())
        .await;
    let code = v["error"]["code"].as_str().unwrap_or_else(|| {
        panic!(
            "{} {path}: {status} is not in the error format: {v}",
            r.method
        )
    });
    assert!(
        matches!(status, 401 | 403 | 404),
        "{} {path} with {token:?}: {status} {v}",
        r.method
    );
    (status, code.to_owned())
}

/// A server with `seed`'s two orgs, and its OpenAPI document.
async fn seeded(backend: Backend) -> Option<(TestServer, Value)> {
    let srv = TestServer::start(backend).await?;
    seed(&srv).await;
    let (status, doc) = srv.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    Some((srv, doc))
}

/// `path` with an org's ids: its session, and the token `seed` bound to it.
fn fill(path: &str, org: &str, session: &str) -> String {
    path.replace("{org}", org)
        .replace("{session}", session)
        .replace("{token}", &format!("tok_{org}"))
}

/// Two orgs, each with a key, a running session and a token bound to it (`tok_<org>`).
async fn seed(srv: &TestServer) {
    for org in ["org_a", "org_b"] {
        srv.create_org(org, "pro").await;
        srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({})))
            .await;
        let session = format!("ses_{org}");
        srv.admin(
            "POST",
            "/v1/admissions",
            Some(json!({"org_id": org, "key_id": "k1", "session_id": session, "agent": "codex"})),
        )
        .await;
        let (status, _) = srv
            .heartbeats(vec![hb(org, &session, 1, "running", T0)])
            .await;
        assert_eq!(status, 200);
        let mut row = rush_meter::tokens::token_row(
            &format!("secret-of-{org}-0123456789"),
            &[Scope::Ingest],
            Some(org),
            "seeded",
            T0,
        );
        row.token_id = format!("tok_{org}");
        srv.db
            .insert_token(&row, &rush_meter_core::audit::Actor::system("test"))
            .await
            .unwrap();
    }
}

every_backend!(
    no_token_without_the_right_reaches_another_orgs_data,
    a_token_bound_to_an_org_reaches_no_other_whatever_its_scopes,
    the_sweep_covers_every_protected_operation,
    each_operation_takes_exactly_the_scopes_it_documents
);

async fn no_token_without_the_right_reaches_another_orgs_data(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    seed(&srv).await;
    let console_a = srv.token(&[Scope::Console], Some("org_a")).await;
    // (name, secret, the scope of an org-wide token): a route that grants the scope is
    // not the sweep's business.
    let mut tokens: Vec<(String, Option<String>, Option<Scope>)> = vec![
        ("no token".into(), None, None),
        (
            "an unknown token".into(),
            Some("not-a-token-0123456789".into()),
            None,
        ),
        (
            "org_a's console token".into(),
            Some(console_a),
            Some(Scope::Console),
        ),
        (
            "a member token of org_a".into(),
            Some(srv.token(&[Scope::Member], Some("org_a")).await),
            Some(Scope::Member),
        ),
    ];
    for scope in [Scope::Ingest, Scope::Admission, Scope::Finance] {
        tokens.push((
            format!("a token of scope {}", scope.as_str()),
            Some(srv.token(&[scope], None).await),
            Some(scope),
        ));
    }
    let before = srv.db.digest().await.unwrap();
    let mut tried = 0;
    for r in ROUTES {
        for (name, token, scope) in &tokens {
            if scope.is_some_and(|s| r.grants.contains(&s)) {
                continue;
            }
            let real = refusal(&srv, r, token.as_deref(), "org_b", "ses_org_b").await;
            let ghost = refusal(&srv, r, token.as_deref(), "org_zz", "ses_org_zz").await;
            assert_eq!(
                real, ghost,
                "{} {} with {name}: org_b's answer differs from a missing org's",
                r.method, r.path
            );
            tried += 1;
        }
    }
    assert_eq!(
        srv.db.digest().await.unwrap(),
        before,
        "a refused request wrote something"
    );
    assert!(tried > 50, "{tried}");
    let names: Vec<&str> = tokens.iter().map(|(n, ..)| n.as_str()).collect();
    // Both backends sweep alike; the report is PostgreSQL's, production's database.
    if backend != Backend::Postgres {
        return;
    }
    std::fs::write(
        concat!(env!("CARGO_MANIFEST_DIR"), "/reports/access.md"),
        format!(
            "# Access sweep\n\n\
             - Command: `cargo test --test access` (run by `.ci/run`; it rewrites this file);\n\
             the sweep runs on SQLite and PostgreSQL alike, and this is PostgreSQL's run\n\n\
             Every protected route of `/openapi.json` ({routes}, checked against the document\n\
             by `the_sweep_covers_every_protected_operation`) with each of {n} tokens that must\n\
             not reach org_b's data: {names}. A token is not tried on a route its scope grants.\n\
             Each answer must be a refusal in the error format, equal to the answer for an org\n\
             that does not exist, and the database must be unchanged.\n\n\
             | routes | tokens | refusals checked | answers revealing org_b | rows written |\n\
             | --- | --- | --- | --- | --- |\n\
             | {routes} | {n} | {tried} | 0 | 0 |\n",
            routes = ROUTES.len(),
            n = tokens.len(),
            names = names.join(", "),
        ),
    )
    .unwrap();
}

/// Routes over every org at once: refused (403) to a token bound to one, whatever its scopes.
const SERVICE_WIDE: &[&str] = &[
    "/v1/audit",
    "/v1/plans",
    "/v1/plans/pro/migrations",
    "/v1/periods",
    "/v1/periods/2026-10/close",
    "/v1/admin/stripe/events",
    "/v1/admin/stripe/events/evt_1/retry",
];

/// Whether a route names an org's data: in its path or query, or in its body.
fn names_org(r: &Route) -> bool {
    r.path.contains('{')
        || (r.body)("org_x", "ses_x").is_some_and(|b| b.to_string().contains("org_x"))
}

/// A token bound to org_a, of any scope (admin and finance included), gets from every route
/// that names org_b's data what it gets for an org that does not exist, never a 2xx;
/// routes that name no org answer it with org_a's data only, or refuse it when they cover
/// every org; and on org_a's own data it passes as its scope says.
async fn a_token_bound_to_an_org_reaches_no_other_whatever_its_scopes(backend: Backend) {
    let Some((srv, doc)) = seeded(backend).await else {
        return;
    };
    let mut tokens = Vec::new();
    for scope in Scope::ALL {
        tokens.push((scope, srv.token(&[scope], Some("org_a")).await));
    }
    let before = srv.db.digest().await.unwrap();
    let mut named = 0;
    for (scope, token) in &tokens {
        for r in ROUTES {
            if names_org(r) {
                let real = refusal(&srv, r, Some(token), "org_b", "ses_org_b").await;
                let ghost = refusal(&srv, r, Some(token), "org_zz", "ses_org_zz").await;
                assert_eq!(
                    real, ghost,
                    "{} {} with a {scope} token bound to org_a: org_b's answer differs from a missing org's",
                    r.method, r.path
                );
                named += 1;
                continue;
            }
            let (status, v) = srv
                .call(
                    r.method,
                    r.path,
                    Some(token),
                    (r.body)("org_a", "ses_org_a").as_ref(),
                )
                .await;
            let text = v.to_string();
            assert!(
                !text.contains("org_b"),
                "{} {} with a {scope} token bound to org_a shows org_b: {status} {text}",
                r.method,
                r.path
            );
            let listed = documented_scopes(&doc, r);
            if SERVICE_WIDE.contains(&r.path) && listed.iter().any(|s| s == scope.as_str()) {
                assert_eq!(status, 403, "{} {}: {v}", r.method, r.path);
                assert!(v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("bound to one org"));
            }
        }
    }
    assert_eq!(
        srv.db.digest().await.unwrap(),
        before,
        "a refused request wrote something"
    );
    assert!(named > 100, "{named}");
    // What lists every org's rows lists the bound org's only.
    let finance = &tokens.iter().find(|(s, _)| *s == Scope::Finance).unwrap().1;
    let (status, v) = srv
        .call(
            "GET",
            "/v1/exports/usage?period=2026-11&by=session&format=jsonl",
            Some(finance),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // One line of JSONL reads as JSON: looked at as text either way.
    let lines = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    assert!(
        lines.contains("ses_org_a") && !lines.contains("org_b"),
        "{lines}"
    );
    let (_, v) = srv.call("GET", "/v1/orgs", Some(finance), None).await;
    assert_eq!(v["orgs"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["orgs"][0]["org_id"], "org_a");
    // On its own org a bound token passes as its scope says (writes allowed from here on).
    for (scope, token) in &tokens {
        for r in ROUTES {
            if SERVICE_WIDE.contains(&r.path)
                || !documented_scopes(&doc, r)
                    .iter()
                    .any(|s| s == scope.as_str())
            {
                continue;
            }
            let path = fill(r.path, "org_a", "ses_org_a");
            let body = (r.body)("org_a", "ses_org_a");
            let (status, v) = srv.call(r.method, &path, Some(token), body.as_ref()).await;
            assert!(
                !(matches!(status, 401 | 403)
                    || status == 404 && v["error"]["code"] == "org_not_found"),
                "{} {path}: a {scope} token bound to org_a was refused its own org: {status} {v}",
                r.method
            );
        }
    }
}

/// The sweep is every protected operation the OpenAPI document names: a route added
/// without a place here fails this test.
async fn the_sweep_covers_every_protected_operation(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    let (status, doc) = srv.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    let mut protected = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if op.get("security").is_none() {
                continue;
            }
            protected += 1;
            let method = method.to_uppercase();
            assert!(
                ROUTES
                    .iter()
                    .any(|r| r.method == method && matches(template, r.path)),
                "{method} {template} is documented as protected but the sweep does not try it"
            );
        }
    }
    assert_eq!(
        protected,
        ROUTES.len(),
        "the sweep tries a route the document does not protect"
    );
}

/// Whether the sweep's `path` is an instance of the document's `template`.
fn matches(template: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap();
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(a, b)| a.starts_with('{') || b.starts_with('{') || a == b)
}

/// The scopes the document says `r` takes (its `security` requirement).
fn documented_scopes(doc: &Value, r: &Route) -> Vec<String> {
    let (_, item) = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(template, item)| {
            matches(template, r.path) && item.get(r.method.to_lowercase()).is_some()
        })
        .unwrap_or_else(|| panic!("{} {} is not in the document", r.method, r.path));
    item[r.method.to_lowercase()]["security"][0]["bearer"]
        .as_array()
        .unwrap_or_else(|| panic!("{} {} documents no scopes", r.method, r.path))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// The document's scopes are the contract: a token of each scope an operation lists gets
/// past authorisation on its own org's data, a token of any other scope gets 403, and the
/// sweep's own table of grants says the same.
async fn each_operation_takes_exactly_the_scopes_it_documents(backend: Backend) {
    let Some((srv, doc)) = seeded(backend).await else {
        return;
    };
    let mut tokens = Vec::new();
    for scope in Scope::ALL {
        let bound = matches!(scope, Scope::Console | Scope::Member).then_some("org_a");
        tokens.push((scope, srv.token(&[scope], bound).await));
    }
    let mut checked = 0;
    for r in ROUTES {
        let listed = documented_scopes(&doc, r);
        // Admin reaches everything but a member's own page, which names a user it has not.
        assert!(
            listed.iter().any(|s| s == "admin") || listed == ["member"],
            "{}: {listed:?}",
            r.path
        );
        let mut unbound: Vec<&str> = listed
            .iter()
            .map(String::as_str)
            .filter(|s| !matches!(*s, "admin" | "console" | "member"))
            .collect();
        let mut grants: Vec<&str> = r
            .grants
            .iter()
            .map(|g| g.as_str())
            .filter(|g| !matches!(*g, "admin" | "console" | "member"))
            .collect();
        unbound.sort_unstable();
        grants.sort_unstable();
        assert_eq!(
            unbound, grants,
            "{} {}: document against the sweep",
            r.method, r.path
        );
        let path = fill(r.path, "org_a", "ses_org_a");
        for (scope, token) in &tokens {
            let body = (r.body)("org_a", "ses_org_a");
            let (status, v) = srv.call(r.method, &path, Some(token), body.as_ref()).await;
            if listed.iter().any(|s| s == scope.as_str()) {
                assert!(
                    !matches!(status, 401 | 403),
                    "{} {path} lists `{}` but refused it: {status} {v}",
                    r.method,
                    scope.as_str()
                );
            } else {
                assert_eq!(
                    status,
                    403,
                    "{} {path} does not list `{}`: {v}",
                    r.method,
                    scope.as_str()
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, ROUTES.len() * Scope::ALL.len());
}
