//! The finance export and the closing of billing periods (DESIGN.md rules 6 and 8).
//!
//! A billing period here is a calendar month in UTC: what finance closes. An open period
//! is exported live from the ledger's rollups; closing a period freezes every session's
//! line and every org's totals with its plan's terms, and a closed period is exported
//! from what was frozen, so its bytes never change. Heartbeats are clamped to the lease
//! (at most a day), so usage can arrive late only for the last closed period: it stays
//! in the ledger where it happened, and the first open period shows it as
//! `adjustment_seconds` (rollup now less what was frozen), frozen in turn when that
//! period closes.

pub mod lines;

use tokio::sync::mpsc;

use crate::ledger::{Interval, Secs};
use crate::plans::Plans;
use crate::quota::{calendar_month, format_rfc3339};
use crate::store::{Db, FrozenOrgRow, LineQuery, OrgRow, PeriodRow, StoreError};
use lines::{Format, OrgTotals, Terms, ORG_COLUMNS, SESSION_COLUMNS};

/// Which rows an export has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Org,
    Session,
}

impl By {
    /// Every value `parse` takes, for the OpenAPI document.
    pub const NAMES: [&'static str; 2] = ["org", "session"];

    pub fn parse(s: &str) -> Option<By> {
        match s {
            "org" => Some(By::Org),
            "session" => Some(By::Session),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            By::Org => "org",
            By::Session => "session",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The request cannot be served as asked (the message says why).
    #[error("{0}")]
    Invalid(String),
    /// No month up to the one asked for has anything to close: it is before the first
    /// org's, or there is no org yet.
    #[error("{0}")]
    NothingToClose(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `YYYY-MM` as its calendar month in UTC.
pub fn parse_month(s: &str) -> Result<Interval, String> {
    let bad = || format!("period: `{s}` is not a month such as 2026-11 (YYYY-MM)");
    if s.len() != 7 {
        return Err(bad());
    }
    let date =
        chrono::NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d").map_err(|_| bad())?;
    let start = date
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp();
    Ok(calendar_month(start))
}

/// A month as `YYYY-MM`.
pub fn month_name(period: Interval) -> String {
    crate::quota::to_datetime(period.start)
        .format("%Y-%m")
        .to_string()
}

/// The last month whose end is at least `settle` seconds before `now`.
pub fn due_month(now: Secs, settle: Secs) -> Interval {
    let current = calendar_month(now - settle);
    calendar_month(current.start - 1)
}

/// The months from `from` (a month's start) through `through`, in order.
pub fn months_between(from: Secs, through: Interval) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut m = calendar_month(from);
    while m.start <= through.start {
        out.push(m);
        m = calendar_month(m.end);
    }
    out
}

/// How an export of `period` reads, as of `now`.
pub async fn line_query(db: &Db, period: Interval, now: Secs) -> Result<LineQuery, ExportError> {
    if period.start > now {
        return Err(ExportError::Invalid(format!(
            "period: {} has not started yet",
            month_name(period)
        )));
    }
    if db.get_period(period.start).await?.is_some() {
        return Ok(LineQuery {
            period,
            closed: true,
            adjusts: None,
        });
    }
    let last = db.list_periods().await?.into_iter().next();
    Ok(LineQuery {
        period,
        closed: false,
        adjusts: last
            .filter(|l| l.period_end == period.start)
            .and_then(|l| Interval::new(l.period_start, l.period_end)),
    })
}

/// A piece of an export: its bytes and how many rows they hold.
pub struct Chunk {
    pub bytes: Vec<u8>,
    pub rows: u64,
}

/// Bytes gathered before a chunk is handed on.
const CHUNK_BYTES: usize = 64 * 1024;

/// Write the export of `q` into `out`, header first, in chunks. Stops quietly when the
/// receiver goes away (a client that hung up).
pub async fn produce(
    db: &Db,
    plans: &Plans,
    q: LineQuery,
    by: By,
    format: Format,
    now: Secs,
    out: mpsc::Sender<Chunk>,
) -> Result<(), ExportError> {
    let mut buf = Vec::with_capacity(CHUNK_BYTES * 2);
    match by {
        By::Org => {
            format.header(&ORG_COLUMNS, &mut buf);
            let orgs = org_totals(db, plans, &q, now).await?;
            let mut rows = 0;
            for o in &orgs {
                lines::write_org(format, q.period, o, &mut buf);
                rows += 1;
                if buf.len() >= CHUNK_BYTES && !hand_on(&out, &mut buf, &mut rows).await {
                    return Ok(());
                }
            }
            hand_on(&out, &mut buf, &mut rows).await;
        }
        By::Session => {
            format.header(&SESSION_COLUMNS, &mut buf);
            let (tx, mut rx) = mpsc::channel(4);
            let read = async move {
                let r = db.send_session_lines(&q, &tx).await;
                drop(tx);
                r
            };
            let write = async {
                let mut rows = 0;
                while let Some(batch) = rx.recv().await {
                    for line in &batch {
                        lines::write_session(format, line, &mut buf);
                    }
                    rows += batch.len() as u64;
                    if buf.len() >= CHUNK_BYTES && !hand_on(&out, &mut buf, &mut rows).await {
                        // Stops the reader at its next send, and its query with it.
                        rx.close();
                        return;
                    }
                }
                hand_on(&out, &mut buf, &mut rows).await;
            };
            let (read, ()) = tokio::join!(read, write);
            read?;
        }
    }
    Ok(())
}

async fn hand_on(out: &mpsc::Sender<Chunk>, buf: &mut Vec<u8>, rows: &mut u64) -> bool {
    let bytes = std::mem::replace(buf, Vec::with_capacity(CHUNK_BYTES * 2));
    let chunk = Chunk {
        bytes,
        rows: std::mem::take(rows),
    };
    out.send(chunk).await.is_ok()
}

/// Every org's line of a period: frozen, or live with each org's plan as of `now`.
async fn org_totals(
    db: &Db,
    plans: &Plans,
    q: &LineQuery,
    now: Secs,
) -> Result<Vec<OrgTotals>, ExportError> {
    if q.closed {
        return db
            .frozen_orgs(q.period.start)
            .await?
            .into_iter()
            .map(frozen_totals)
            .collect();
    }
    let sums: std::collections::HashMap<String, (i64, i64)> = db
        .live_org_sums(q)
        .await?
        .into_iter()
        .map(|(org, run, adj)| (org, (run, adj)))
        .collect();
    Ok(db
        .orgs_before(q.period.end)
        .await?
        .into_iter()
        .map(|org| {
            let (run, adj) = sums.get(&org.org_id).copied().unwrap_or((0, 0));
            OrgTotals {
                terms: terms_now(&org, plans, now),
                org_id: org.org_id,
                stripe_customer_id: org.stripe_customer_id,
                stripe_subscription_id: org.stripe_subscription_id,
                agent_seconds: run,
                adjustment_seconds: adj,
            }
        })
        .collect())
}

/// The terms an org is billed on now: the plan its subscription grants.
fn terms_now(org: &OrgRow, plans: &Plans, now: Secs) -> Terms {
    Terms::of(&crate::standing::effective_plan(org, plans, now))
}

fn frozen_totals(r: FrozenOrgRow) -> Result<OrgTotals, ExportError> {
    let dec = |field: &str, v: &str| {
        v.parse().map_err(|_| {
            ExportError::Invalid(format!(
                "period_orgs.{field} of {} is not a decimal: `{v}`",
                r.org_id
            ))
        })
    };
    Ok(OrgTotals {
        terms: Terms {
            plan_id: r.plan_id.clone(),
            included_hours: dec("included_hours", &r.included_hours)?,
            unit_price: dec("unit_price", &r.unit_price)?,
            price: dec("price", &r.price)?,
            currency: r.currency.clone(),
        },
        org_id: r.org_id,
        stripe_customer_id: r.stripe_customer_id,
        stripe_subscription_id: r.stripe_subscription_id,
        agent_seconds: r.agent_seconds,
        adjustment_seconds: r.adjustment_seconds,
    })
}

/// Close every open month up to and including `through`, oldest first, each in its own
/// transaction; months another instance closed meanwhile are skipped. Returns the
/// periods this call closed. The first month there is to close is the first org's: an
/// earlier one is refused, since closing it would leave every month since to be closed
/// (a typo of `1026-11` would mean twelve thousand).
pub async fn close_through(
    db: &Db,
    plans: &Plans,
    through: Interval,
    now: Secs,
) -> Result<Vec<PeriodRow>, ExportError> {
    if through.end > now {
        return Err(ExportError::Invalid(format!(
            "period: {} has not ended; it can be closed from {}",
            month_name(through),
            format_rfc3339(through.end)
        )));
    }
    let Some(first) = db.first_org_created().await?.map(calendar_month) else {
        return Err(ExportError::NothingToClose(
            "period: there is no org yet, so nothing to close".into(),
        ));
    };
    if through.start < first.start {
        return Err(ExportError::NothingToClose(format!(
            "period: {} is before the first org's month, {}; there is nothing to close",
            month_name(through),
            month_name(first)
        )));
    }
    let last = db.list_periods().await?.into_iter().next();
    let from = last.as_ref().map_or(first.start, |l| l.period_end);
    let mut adjusts = last
        .filter(|l| l.period_end == from)
        .and_then(|l| Interval::new(l.period_start, l.period_end));
    let terms = |org: &OrgRow| terms_now(org, plans, now);
    let mut closed = Vec::new();
    for month in months_between(from, through) {
        let q = LineQuery {
            period: month,
            closed: false,
            adjusts,
        };
        if let Some(row) = db.close_period(&q, now, &terms).await? {
            tracing::info!(
                period = %month_name(month),
                orgs = row.orgs,
                sessions = row.sessions,
                agent_seconds = row.agent_seconds,
                adjustment_seconds = row.adjustment_seconds,
                "billing period closed"
            );
            closed.push(row);
        }
        adjusts = Some(month);
    }
    Ok(closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn month(s: &str) -> Interval {
        parse_month(s).unwrap()
    }

    #[test]
    fn months_parse_strictly() {
        let nov = month("2026-11");
        assert_eq!(format_rfc3339(nov.start), "2026-11-01T00:00:00Z");
        assert_eq!(format_rfc3339(nov.end), "2026-12-01T00:00:00Z");
        assert_eq!(month_name(nov), "2026-11");
        for bad in ["2026-13", "2026-1", "26-11", "2026-11-01", "", "november"] {
            assert!(parse_month(bad).is_err(), "{bad}");
        }
        let feb = month("2028-02");
        assert_eq!(feb.len(), 29 * 86_400);
    }

    #[test]
    fn the_due_month_waits_for_the_settling_delay() {
        let dec1 = month("2026-12").start;
        assert_eq!(due_month(dec1 + 3_600, 3_600), month("2026-11"));
        assert_eq!(due_month(dec1 + 3_599, 3_600), month("2026-10"));
    }

    #[test]
    fn months_between_runs_through_year_ends() {
        let got: Vec<String> = months_between(month("2026-11").start, month("2027-02"))
            .into_iter()
            .map(month_name)
            .collect();
        assert_eq!(got, ["2026-11", "2026-12", "2027-01", "2027-02"]);
        assert!(months_between(month("2027-03").start, month("2027-02")).is_empty());
    }
}
