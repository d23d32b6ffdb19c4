//! The real `rush-meter` binary, spawned on a database as an operator runs it, and the
//! log lines it writes.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;

use super::{eventually, repo_plans};

/// The `rush-meter` binary serving `database_url` on a free port with `token` as its
/// bootstrap admin token; returns once `/readyz` answers 200 (at most 30 s).
pub async fn spawn_service(database_url: &str, token: &str) -> (tokio::process::Child, String) {
    spawn_service_with(database_url, token, &[]).await
}

/// `spawn_service` with extra environment variables.
pub async fn spawn_service_with(
    database_url: &str,
    token: &str,
    envs: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let (child, base, _) = spawn_service_logging(database_url, token, envs, "error").await;
    (child, base)
}

/// A spawned service's log lines (JSON, one object a line), as they come.
pub type Logs = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// `spawn_service_with`, logging at `level` (`RUST_LOG`) in JSON; the lines are kept in
/// the returned `Logs` and echoed to the test's stderr.
///
/// The service picks its own port (`--listen 127.0.0.1:0`) and the address is read from
/// its "serving" line: a port found free by the test and handed over could be taken by
/// another test's process meanwhile, and then `/readyz` would answer from that one.
pub async fn spawn_service_logging(
    database_url: &str,
    token: &str,
    envs: &[(&str, &str)],
    level: &str,
) -> (tokio::process::Child, String, Logs) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rush-meter"))
        .args(["--database-url", database_url, "--listen", "127.0.0.1:0"])
        .env("RUSH_METER_BOOTSTRAP_ADMIN_TOKEN", token)
        .env("RUSH_METER_PLANS_DIR", repo_plans())
        .env("RUSH_METER_LOG_FORMAT", "json")
        .env("RUST_LOG", format!("{level},rush_meter::cli::serve=info"))
        .envs(envs.iter().copied())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logs = Logs::default();
    let (tx, rx) = oneshot::channel();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let kept = logs.clone();
    tokio::spawn(async move {
        let mut announce = Some(tx);
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            let serving = serde_json::from_str::<Value>(&line)
                .ok()
                .filter(|v| v["message"] == "rush-meter serving")
                .and_then(|v| v["listen"].as_str().map(str::to_owned));
            if let Some(addr) = serving {
                announce.take().map(|tx| tx.send(addr));
            }
            kept.lock().unwrap().push(line);
        }
    });
    // Dropped unsent when the process exits before it serves.
    let addr = match tokio::time::timeout(Duration::from_secs(30), rx).await {
        Ok(Ok(addr)) => addr,
        Ok(Err(_)) => panic!(
            "the service exited before serving: {:?}",
            child.wait().await
        ),
        Err(_) => panic!("the service did not serve within 30 s"),
    };
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    eventually(30, "the service is ready", || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    (child, base, logs)
}
