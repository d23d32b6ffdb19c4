//! Python tools the tests drive (localstripe, schemathesis), installed on first use into
//! the project's `.venv/` at the versions the tests are written against; `.ci/run`
//! installs the same.

use std::path::PathBuf;
use std::sync::Mutex;

pub const VENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv");

/// `.venv/bin/<bin>`, installing `requirement` first if it is missing. `None` (with a
/// note) when it cannot be installed, except on CI, where that fails the test.
pub fn tool(bin: &str, requirement: &str) -> Option<PathBuf> {
    // One pip at a time: tests of one binary may ask at once.
    static PIP: Mutex<()> = Mutex::new(());
    let _one = PIP.lock().unwrap_or_else(|e| e.into_inner());
    let path = PathBuf::from(format!("{VENV}/bin/{bin}"));
    if !path.exists() {
        let ok = |c: &mut std::process::Command| c.status().is_ok_and(|s| s.success());
        let _ = std::path::Path::new(&format!("{VENV}/bin/pip")).exists()
            || ok(std::process::Command::new("python3").args(["-m", "venv", VENV]));
        ok(std::process::Command::new(format!("{VENV}/bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ]));
    }
    if path.exists() {
        return Some(path);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{requirement} is required on CI; .ci/run installs it into .venv ({} is missing)",
            path.display()
        );
    }
    eprintln!(
        "NOTE: {} missing (python3 -m venv .venv && .venv/bin/pip install {requirement}); this test did not run",
        path.display()
    );
    None
}
