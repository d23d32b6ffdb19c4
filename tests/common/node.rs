//! Node tools the tests drive (Stripe's official library, which signs webhook events as
//! Stripe does; playwright-core, which drives Chromium through the console), installed on
//! first use into `tests/node/node_modules` from its lockfile; `.ci/run` installs the same.

use std::path::PathBuf;
use std::sync::Mutex;

pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node");

/// `tests/node/<script>`, with its packages installed (`npm ci`) if they are missing.
/// `None` (with a note) when they cannot be, except on CI, where that fails the test.
pub fn script(script: &str) -> Option<PathBuf> {
    static NPM: Mutex<()> = Mutex::new(());
    let _one = NPM.lock().unwrap_or_else(|e| e.into_inner());
    let installed = PathBuf::from(format!("{DIR}/node_modules/.package-lock.json"));
    let lock = PathBuf::from(format!("{DIR}/package-lock.json"));
    // `npm ci` again whenever the lockfile is newer than what was installed.
    if !up_to_date(&installed, &lock) {
        let _ = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix", DIR])
            .status();
    }
    if up_to_date(&installed, &lock) {
        return Some(PathBuf::from(format!("{DIR}/{script}")));
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("tests/node's packages are required on CI; .ci/run installs them (npm ci --prefix tests/node)");
    }
    eprintln!(
        "NOTE: tests/node's packages missing (npm ci --prefix tests/node); this test did not run"
    );
    None
}

/// `installed` exists and was written after `lock`.
fn up_to_date(installed: &std::path::Path, lock: &std::path::Path) -> bool {
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(installed), modified(lock)) {
        (Some(i), Some(l)) => i >= l,
        _ => false,
    }
}

/// The `Stripe-Signature` header Stripe's own library makes for `payload` at `at`.
pub fn stripe_signature(secret: &str, at: i64, payload: &str) -> Option<String> {
    use std::io::Write as _;
    let sign = script("sign.js")?;
    let mut child = std::process::Command::new("node")
        .arg(sign)
        .args([secret, &at.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "sign.js failed: {out:?}");
    Some(String::from_utf8(out.stdout).unwrap())
}
