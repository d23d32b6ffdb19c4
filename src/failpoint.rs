//! Crash points for fault drills: `RUSH_METER_FAILPOINT=<name>` makes the process abort
//! at that point, as a `kill -9` would, so tests can prove what survives a crash there.

/// Abort the process if `RUSH_METER_FAILPOINT` names this point.
pub fn hit(name: &str) {
    if std::env::var("RUSH_METER_FAILPOINT").is_ok_and(|v| v == name) {
        eprintln!("rush-meter: failpoint {name} reached; aborting");
        std::process::abort();
    }
}
