//! The OpenAPI document against the router that serves it: every documented operation is
//! routed, every other method on a documented path is a 405, every error status an
//! operation can answer is described in the error format, and no route is added outside
//! the `routes!` lists the document is generated from.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Backend, TestServer};
use serde_json::Value;

const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "PATCH"];

/// `(METHOD, path)` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .keys()
                .filter(|k| METHODS.contains(&k.to_uppercase().as_str()))
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect()
}

/// A concrete path: every `{param}` filled with an id that exists nowhere.
fn concrete(path: &str) -> String {
    fill(path, |name| {
        if name == "period" {
            "2020-01"
        } else {
            "no-such-id"
        }
    })
}

/// `path` with each `{name}` replaced by `value(name)`.
fn fill(path: &str, value: impl Fn(&str) -> &'static str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(i) = rest.find('{') {
        let j = rest[i..].find('}').expect("closing brace") + i;
        out.push_str(&rest[..i]);
        out.push_str(value(&rest[i + 1..j]));
        rest = &rest[j + 1..];
    }
    out + rest
}

/// The error code of a JSON error body, if that is what `v` is.
fn error_code(v: &Value) -> Option<&str> {
    v["error"]["code"].as_str()
}

async fn document(srv: &TestServer) -> Value {
    let (status, doc) = srv.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200, "{doc}");
    doc
}

every_backend!(
    every_documented_operation_is_routed_and_no_other_method_is,
    every_error_status_is_described_in_the_error_format,
    the_frameworks_refusals_are_in_the_error_format,
    path_parameters_are_each_declared_once_required_and_described,
    the_document_is_valid_and_a_client_generated_from_it_drives_the_service
);

const SPEC_VALIDATOR: &str = "openapi-spec-validator==0.9.0";
const CLIENT_GENERATOR: &str = "openapi-python-client==0.29.1";

/// Every `"$ref"` in `v` that does not resolve in `doc`, with where it was found.
fn dangling_refs(doc: &Value, v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                let pointer = r.strip_prefix('#').unwrap_or("!");
                if doc.pointer(pointer).is_none() {
                    out.push(format!("{at}: {r}"));
                }
            }
            for (k, x) in m {
                dangling_refs(doc, x, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                dangling_refs(doc, x, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// A real validator accepts the document, every `$ref` in it resolves, and a Python client
/// generated from it (openapi-python-client, as a caller would make one) admits a session,
/// sends its heartbeats, reads the usage and ends it, parsing every answer into its models.
async fn the_document_is_valid_and_a_client_generated_from_it_drives_the_service(backend: Backend) {
    let (Some(validator), Some(generator)) = (
        common::venv::tool("openapi-spec-validator", SPEC_VALIDATOR),
        common::venv::tool("openapi-python-client", CLIENT_GENERATOR),
    ) else {
        return;
    };
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    let doc = document(&srv).await;
    let mut dangling = Vec::new();
    dangling_refs(&doc, &doc, "", &mut dangling);
    assert!(dangling.is_empty(), "unresolved $refs: {dangling:?}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = std::process::Command::new(&validator)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator refuses the document: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let package = dir.path().join("rush_meter_client");
    let out = std::process::Command::new(&generator)
        .args(["generate", "--meta", "none", "--path"])
        .arg(&file)
        .arg("--output-path")
        .arg(&package)
        .output()
        .unwrap();
    assert!(
        out.status.success() && package.join("client.py").exists(),
        "openapi-python-client could not generate a client: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let python = std::path::Path::new(common::venv::VENV).join("bin/python");
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/drive_client.py"
        ))
        .env("PYTHONPATH", dir.path())
        .env("RUSH_METER_URL", &srv.url)
        .env("RUSH_METER_TOKEN", common::ADMIN)
        .env("RUSH_METER_NOW", srv.clock.now().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the generated client failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        seen,
        serde_json::json!({
            "plan": "pro", "decision": "allow", "actions": ["continue", "continue"],
            "duplicates": [false, false], "running_sessions": 1,
            "month_limit_seconds": 144000, "ended": "ended"
        })
    );
    srv.finish().await;
}

async fn every_documented_operation_is_routed_and_no_other_method_is(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    let doc = document(&srv).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let ops = operations(&doc);
    assert!(ops.len() >= 25, "only {} operations documented", ops.len());
    let by_path: BTreeMap<&str, BTreeSet<&str>> =
        ops.iter().fold(BTreeMap::new(), |mut m, (method, path)| {
            m.entry(path.as_str()).or_default().insert(method.as_str());
            m
        });
    let mut checked = 0;
    for (path, methods) in &by_path {
        let url = concrete(path);
        for method in METHODS {
            // Without a token: a routed operation refuses (401) or answers; the router's
            // own fallbacks say `not_found` with "no such route", or 405.
            let (status, v) = srv.call(method, &url, None, None).await;
            if methods.contains(method) {
                assert_ne!(
                    status, 405,
                    "{method} {path} is documented but not routed: {v}"
                );
                assert!(
                    !(status == 404 && v.to_string().contains("no such route")),
                    "{method} {path} is documented but not routed: {v}"
                );
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {path} is routed but not documented: {v}"
                );
                assert_eq!(error_code(&v), Some("method_not_allowed"), "{v}");
            }
            checked += 1;
        }
    }
    println!(
        "{} operations on {} paths, {checked} method/path pairs checked",
        ops.len(),
        by_path.len()
    );
}

async fn every_error_status_is_described_in_the_error_format(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    let doc = document(&srv).await;
    let open = [
        "/console",
        "/console/app.css",
        "/console/app.js",
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/readyz",
        "/v1/stripe/webhook",
    ];
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let responses = op["responses"].as_object().expect("responses");
        let statuses: BTreeSet<&str> = responses.keys().map(String::as_str).collect();
        assert!(
            statuses.iter().any(|s| s.starts_with('2')),
            "{method} {path}: no success"
        );
        for (status, r) in responses {
            assert!(
                r["description"].as_str().is_some_and(|d| !d.is_empty()),
                "{method} {path} {status}: no description"
            );
            if status.starts_with('4') || status.starts_with('5') {
                assert_eq!(
                    r["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path} {status} is not in the error format"
                );
            }
        }
        if !open.contains(&path.as_str()) {
            // Every protected route can refuse, limit, fail and be unavailable.
            for s in ["401", "403", "429", "500", "503"] {
                assert!(
                    statuses.contains(s),
                    "{method} {path} does not describe {s}"
                );
            }
            assert!(
                op["security"][0].get("bearer").is_some(),
                "{method} {path} does not name the bearer scheme"
            );
        }
        for s in ["429", "503"] {
            if let Some(r) = responses.get(s) {
                assert!(
                    r["headers"].get("Retry-After").is_some(),
                    "{method} {path} {s} has no Retry-After"
                );
            }
        }
        // A refusal without a token is one the document describes, in its format.
        let (status, v) = srv.call(&method, &concrete(&path), None, None).await;
        if status >= 400 {
            assert!(
                statuses.contains(status.to_string().as_str()),
                "{method} {path} answered {status}, which it does not describe: {v}"
            );
            assert!(error_code(&v).is_some(), "{method} {path} {status}: {v}");
        }
    }
    let schema = &doc["components"]["schemas"]["ErrorDetail"];
    let required: Vec<&str> = schema["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["code", "message"]);
}

/// Every Rust file under `dir`, however deep.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Routes reach the router only through `routes!` (which documents them): a plain
/// `.route(` anywhere in the service would serve a path the document does not have.
#[test]
fn no_route_bypasses_the_document() {
    let src = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let files = rust_files(src);
    assert!(files.len() > 20, "the service's sources: {files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for bypass in [
            ".route(",
            ".route_service(",
            ".nest(",
            ".nest_service(",
            ".merge(",
        ] {
            assert!(
                !text.contains(bypass),
                "{} calls `{bypass}`: add the handler with `routes!` in http::routes instead",
                path.display()
            );
        }
    }
}

/// Axum's own refusals (a path that is not UTF-8, a body over the limit, on every route
/// that takes one) are answered in the error format, with a status the document lists.
async fn the_frameworks_refusals_are_in_the_error_format(backend: Backend) {
    let opts = common::Options {
        max_body_bytes: 1024,
        stripe: rush_meter::config::StripeConfig {
            webhook_secrets: vec![secrecy::SecretString::from("whsec_test")],
            ..Default::default()
        },
        ..common::Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    let doc = document(&srv).await;
    let big = "x".repeat(4096);
    let mut tried = 0;
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let mut cases = Vec::new();
        if path.contains('{') {
            cases.push((fill(&path, |_| "%FF"), None));
        }
        if op.get("requestBody").is_some() {
            cases.push((concrete(&path), Some(big.clone())));
        }
        for (url, body) in cases {
            let mut req = srv
                .client
                .request(method.parse().unwrap(), format!("{}{url}", srv.url))
                .bearer_auth(common::ADMIN)
                .header("content-type", "application/json");
            if let Some(b) = body {
                req = req.body(b);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap_or_else(|e| {
                panic!("{method} {url} answered {status} outside the error format: {e}")
            });
            assert!(error_code(&v).is_some(), "{method} {url} {status}: {v}");
            assert!(
                op["responses"].get(status.to_string()).is_some(),
                "{method} {url} answered {status}, which it does not describe: {v}"
            );
            tried += 1;
        }
    }
    assert!(tried >= 20, "{tried}");
}

/// Every parameter is named once per operation; each `{name}` of a path is exactly one
/// required path parameter with a description; and ids carry the id pattern, so a client
/// generator gets them right.
async fn path_parameters_are_each_declared_once_required_and_described(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    let doc = document(&srv).await;
    let mut path_params = 0;
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let params: Vec<&Value> = op["parameters"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let mut seen = BTreeSet::new();
        for p in &params {
            let key = (p["name"].as_str().unwrap(), p["in"].as_str().unwrap());
            assert!(seen.insert(key), "{method} {path} declares {key:?} twice");
        }
        let names: Vec<&str> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        let in_path: Vec<&&Value> = params.iter().filter(|p| p["in"] == "path").collect();
        assert_eq!(
            in_path.len(),
            names.len(),
            "{method} {path}: path parameters {in_path:?}"
        );
        for name in names {
            let p = in_path
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{method} {path}: no parameter for {{{name}}}"));
            assert_eq!(p["required"], true, "{method} {path}: {p}");
            assert!(p["description"].is_string(), "{method} {path}: {p}");
            if name.ends_with("_id") && name != "event_id" {
                assert_eq!(
                    p["schema"]["pattern"],
                    rush_meter_core::ids::Id::PATTERN,
                    "{method} {path}: {p}"
                );
            }
            path_params += 1;
        }
    }
    assert!(path_params >= 17, "{path_params}");
    // The one required query parameter.
    let export = &doc["paths"]["/v1/exports/usage"]["get"]["parameters"];
    let period = export
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "period")
        .expect("period");
    assert_eq!(period["required"], true, "{period}");
}
