//! The statement audit of every test: each statement the store sends is looked at as it
//! goes (sqlx reports it through `tracing`), and one that locks, upserts or claims rows of
//! an org's table without naming its orgs is a violation, which fails the test whose
//! server stops next. What names the orgs: `org_id = $n` or `org_id = ANY($n)` (IN on
//! SQLite) for a lock, an UPDATE or a claim; a conflict target that holds org_id for an
//! upsert. That the orgs of one statement are one shard's is checked with their values,
//! from the server's log, by tests/citus.rs.

use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

use super::shards::ORG_TABLES;

static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Statements looked at so far.
pub fn seen() -> usize {
    SEEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// The statements seen so far that break the rule.
pub fn violations() -> Vec<String> {
    VIOLATIONS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Why `sql` breaks the rule, if it does.
pub fn violation(sql: &str) -> Option<String> {
    let s = sql
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let org_tables: Vec<&str> = ORG_TABLES
        .iter()
        .copied()
        .filter(|t| names_table(&s, t))
        .collect();
    if org_tables.is_empty() {
        return None;
    }
    let locks = [
        " for update",
        " for no key update",
        " for share",
        " for key share",
        "skip locked",
    ]
    .iter()
    .any(|m| s.contains(m));
    let updates = s.starts_with("update ") || s.contains("(update ") || s.starts_with("delete ");
    let names_orgs = ["org_id = $", "org_id = ?", "org_id = any($", "org_id in ("]
        .iter()
        .any(|m| s.contains(m));
    if (locks || updates) && !names_orgs {
        return Some(format!(
            "locks or updates {org_tables:?} without naming its orgs"
        ));
    }
    for (i, _) in s.match_indices("on conflict (") {
        let target = &s[i + "on conflict (".len()..];
        let target = &target[..target.find(')').unwrap_or(target.len())];
        let upsert = s[i..]
            .split(" on conflict ")
            .next()
            .unwrap_or("")
            .contains(" do update");
        if upsert && !target.split(',').any(|c| c.trim() == "org_id") {
            return Some(format!("upserts on ({target}) without org_id"));
        }
    }
    None
}

/// `table` as a table of the statement: named after FROM, JOIN, UPDATE or INTO (a column
/// of the same name, as `periods.orgs`, is not).
fn names_table(s: &str, table: &str) -> bool {
    s.match_indices(table).any(|(i, _)| {
        let after = s[i + table.len()..].chars().next().unwrap_or(' ');
        let whole = !(after.is_alphanumeric() || after == '_');
        let before = s[..i].trim_end();
        let keyword = ["from", "join", "update", "into", "only"].iter().any(|k| {
            before.ends_with(k)
                && !before[..before.len() - k.len()]
                    .ends_with(|c: char| c.is_alphanumeric() || c == '_')
        });
        whole && keyword && s[..i].ends_with(' ')
    })
}

/// The `tracing` layer that looks at sqlx's statements (target `sqlx::query`).
pub struct StatementAudit;

#[derive(Default)]
struct Statement {
    summary: String,
    full: String,
}

impl Visit for Statement {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.full = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.summary.is_empty() {
            self.summary = format!("{value:?}").trim_matches('"').to_owned();
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for StatementAudit {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut st = Statement::default();
        event.record(&mut st);
        let sql = if st.full.trim().is_empty() {
            st.summary
        } else {
            st.full
        };
        if let Some(why) = violation(&sql) {
            VIOLATIONS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("{why}: {}", sql.trim()));
        }
    }
}
