//! The operator's kit under `deploy/`: the Prometheus alert rules pass `promtool check
//! rules`, the systemd unit passes `systemd-analyze verify` without a warning, and every
//! metric a rule or the Grafana dashboard names is one the service exports.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::TestServer;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file)
}

/// The tool, or `None` (with a note) where it is not installed; on CI (`CI=true`) a
/// missing tool fails the test (.ci/run installs it).
fn tool(name: &str, package: &str) -> Option<&'static str> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(name.to_owned().leak());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{name} is required on CI: apt-get install {package}"
    );
    eprintln!("note: {name} is not installed (apt-get install {package}); not checked");
    None
}

#[test]
fn the_alert_rules_pass_promtool() {
    let Some(promtool) = tool("promtool", "prometheus") else {
        return;
    };
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(deploy("prometheus/rush-meter-rules.yml"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

#[test]
fn the_systemd_unit_verifies_without_a_warning() {
    let Some(analyze) = tool("systemd-analyze", "systemd") else {
        return;
    };
    // The unit as installed, but for the binary: this build's.
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(deploy("systemd/rush-meter.service"))
        .unwrap()
        .replace(
            "/usr/local/bin/rush-meter",
            env!("CARGO_BIN_EXE_rush-meter"),
        );
    let path = dir.path().join("rush-meter.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

/// The series names `/metrics` can carry: each family's `# TYPE` line, with the suffixes
/// its samples take (a family exports no sample before its first observation).
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

/// Every `rush_meter_…` name in `text`.
fn named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("rush_meter_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        out.insert(text[start..end].to_owned());
        i = end;
    }
    out
}

every_backend! {
    async fn every_metric_the_rules_and_the_dashboard_name_is_exported(srv: TestServer) {
        let (status, _, text) = srv.get_text("/metrics", "content-type").await;
        assert_eq!(status, 200);
        let have = exported(&text);
        assert!(have.contains("rush_meter_http_requests_total"), "{have:?}");
        for file in ["prometheus/rush-meter-rules.yml", "grafana/rush-meter.json"] {
            let wanted = named(&std::fs::read_to_string(deploy(file)).unwrap());
            assert!(wanted.len() >= 5, "{file} names {wanted:?}");
            let missing: Vec<&String> = wanted.iter().filter(|n| !have.contains(*n)).collect();
            assert!(missing.is_empty(), "{file} names metrics the service does not export: {missing:?}");
        }
    }
}

#[test]
fn the_dashboard_is_grafana_json_with_a_query_a_panel() {
    let text = std::fs::read_to_string(deploy("grafana/rush-meter.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let panels = d["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for p in panels {
        let expr = p["targets"][0]["expr"].as_str().unwrap_or_default();
        assert!(expr.contains("rush_meter_"), "{p}");
    }
}
