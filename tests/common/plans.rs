//! Plans for a server: the repository's `plans/`, and `free` and `mini`, small enough to
//! spend in a test of funding.

use std::path::PathBuf;

pub fn repo_plans() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("plans")
}

/// The plans of `plans/`, as a server loads them.
pub fn plans() -> rush_meter_core::plans::Plans {
    rush_meter::config::load_plans(&repo_plans()).expect("plans/ loads")
}

/// A plan small enough to spend in a test, `mini`: 180 s a week, 360 s a month, 30 s of
/// grace; pay-as-you-go at 3.60 an hour (a tenth of a cent a second) capped at up to
/// 1.00; top-ups of 1 or 2 hours at 1.00 each; Stripe's `pro_monthly` (20.00) pays for it.
const MINI: &str = r#"
id = "mini"
name = "Mini"
price = "20.00"
currency = "usd"
monthly_agent_hours = 0.1
weekly_agent_hours = 0.05
concurrency_default = 10
concurrency_max = 20
ceiling_grace_seconds = 30
overage_unit_price = "3.60"
overage_cap_max = "1.00"
topup_hours = [1, 2]
topup_hour_price = "1.00"
stripe_prices = ["pro_monthly"]
"#;

const FREE: &str = r#"
id = "free"
name = "Free"
price = "0.00"
currency = "usd"
monthly_agent_hours = 5
weekly_agent_hours = 2
concurrency_default = 4
concurrency_max = 4
upgrade_to = "mini"
"#;

/// A plans directory of `free` and `mini` (above), for the tests of funding.
pub fn mini_plans() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("free.toml"), FREE).unwrap();
    std::fs::write(dir.path().join("mini.toml"), MINI).unwrap();
    dir
}

/// Pro's second version: 30 hours a month and 12 a week, at a Stripe price of its own.
pub fn pro_2() -> String {
    std::fs::read_to_string(repo_plans().join("pro.toml"))
        .unwrap()
        .replace("id = \"pro\"", "id = \"pro\"\nversion = 2")
        .replace("monthly_agent_hours = 40", "monthly_agent_hours = 30")
        .replace("weekly_agent_hours = 15", "weekly_agent_hours = 12")
        .replace("[\"pro_monthly\"]", "[\"pro_monthly_v2\"]")
}

/// A plans directory with the repository's plans, to add versions to.
pub fn repo_plans_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["free.toml", "pro.toml", "team.toml"] {
        std::fs::copy(repo_plans().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// The repository's plans and `mini` (above) beside them, sold by no Stripe price (`pro`
/// sells `pro_monthly`): a plan to spend to its cap in a drill next to the real ones.
pub fn repo_plans_and_mini() -> tempfile::TempDir {
    let dir = repo_plans_copy();
    let mini = MINI.replace("[\"pro_monthly\"]", "[]");
    std::fs::write(dir.path().join("mini.toml"), mini).unwrap();
    dir
}
