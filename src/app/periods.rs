//! The finance export and the closing of billing periods (DESIGN.md rules 6 and 8): the
//! store's reads and writes around the core's lines (`rush_meter_core::export`).
//!
//! A billing period here is a calendar month in UTC: what finance closes. An open period
//! is exported live from the ledger's rollups; closing a period freezes every session's
//! line and every org's totals with its plan's terms, and a closed period is exported
//! from what was frozen, so its bytes never change. Heartbeats are clamped to the lease
//! (at most a day), so usage can arrive late only for the last closed period: it stays
//! in the ledger where it happened, and the first open period shows it as
//! `adjustment_seconds` (rollup now less what was frozen), frozen in turn when that
//! period closes.

use rush_meter_core::charges::Terms;
use rush_meter_core::export::{
    month_name, months_between, By, Format, Lines, OrgTotals, ORG_COLUMNS, SESSION_COLUMNS,
};
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plans;
use rush_meter_core::time::{calendar_month, format_rfc3339, Interval, Secs};
use tokio::sync::mpsc;

use crate::store::{Db, FrozenOrgRow, LineQuery, PeriodRow, StoreError};

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

/// Write the export of `q` into `out`, header first, in chunks: every org's lines, or
/// `only` that org's. Stops quietly when the receiver goes away (a client that hung up).
#[allow(clippy::too_many_arguments)]
pub async fn produce(
    db: &Db,
    plans: &Plans,
    q: LineQuery,
    by: By,
    format: Format,
    now: Secs,
    only: Option<&str>,
    out: mpsc::Sender<Chunk>,
) -> Result<(), ExportError> {
    let mut lines = Lines::new(format);
    // One org's lines are picked from every org's: an org's export is rare (a token bound
    // to the org), and the period's reads stay the ones the export of all orgs makes.
    let ours = |org: &str| only.is_none_or(|o| o == org);
    match by {
        By::Org => {
            lines.header(&ORG_COLUMNS);
            let orgs = org_totals(db, plans, &q, now).await?;
            let mut rows = 0;
            for o in orgs.iter().filter(|o| ours(&o.org_id)) {
                lines.org(q.period, o);
                rows += 1;
                if lines.pending() >= CHUNK_BYTES && !hand_on(&out, &mut lines, &mut rows).await {
                    return Ok(());
                }
            }
            hand_on(&out, &mut lines, &mut rows).await;
        }
        By::Session => {
            lines.header(&SESSION_COLUMNS);
            let (tx, mut rx) = mpsc::channel(4);
            let read = async move {
                let r = db.send_session_lines(&q, &tx).await;
                drop(tx);
                r
            };
            let write = async {
                let mut rows = 0;
                while let Some(batch) = rx.recv().await {
                    for line in batch.iter().filter(|l| ours(&l.org_id)) {
                        lines.session(line);
                        rows += 1;
                    }
                    if lines.pending() >= CHUNK_BYTES && !hand_on(&out, &mut lines, &mut rows).await
                    {
                        // Stops the reader at its next send, and its query with it.
                        rx.close();
                        return;
                    }
                }
                hand_on(&out, &mut lines, &mut rows).await;
            };
            let (read, ()) = tokio::join!(read, write);
            read?;
        }
    }
    Ok(())
}

async fn hand_on(out: &mpsc::Sender<Chunk>, lines: &mut Lines, rows: &mut u64) -> bool {
    let chunk = Chunk {
        bytes: lines.take(),
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
    let (sums, funding) = tokio::join!(db.live_org_sums(q), db.period_funding(q));
    let sums: std::collections::HashMap<String, (i64, i64)> = sums?
        .into_iter()
        .map(|(org, run, adj)| (org, (run, adj)))
        .collect();
    let funding = funding?;
    Ok(db
        .orgs_before(q.period.end)
        .await?
        .into_iter()
        .map(|org| {
            let (run, adj) = sums.get(&org.org_id).copied().unwrap_or((0, 0));
            let (f, fa) = funding.get(&org.org_id).copied().unwrap_or_default();
            OrgTotals {
                funding: f,
                adjustment_funding: fa,
                terms: terms_in(&org, plans, q.period, now),
                org_id: org.org_id,
                stripe_customer_id: org.stripe_customer_id,
                stripe_subscription_id: org.stripe_subscription_id,
                agent_seconds: run,
                adjustment_seconds: adj,
            }
        })
        .collect())
}

/// The terms an org is billed on for `period`, read at `now`: the plan its subscription
/// grants in the period's last second (or now, in a period not over), at the version it
/// was on then: a move to another version at the period's end is the next period's.
fn terms_in(org: &Org, plans: &Plans, period: Interval, now: Secs) -> Terms {
    Terms::of(org.effective_plan(plans, now.min(period.end - 1)))
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
        funding: r.funding(),
        adjustment_funding: r.adjustment_funding(),
        terms: Terms {
            plan_id: r.plan_id.clone(),
            plan_version: r.plan_version,
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
    actor: &rush_meter_core::audit::Actor,
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
    let mut closed = Vec::new();
    for month in months_between(from, through) {
        let terms = |org: &Org| terms_in(org, plans, month, now);
        let q = LineQuery {
            period: month,
            closed: false,
            adjusts,
        };
        if let Some(row) = db.close_period(&q, now, &terms, actor).await? {
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

/// An export under way: whether its period is closed (its bytes final), its chunks as
/// they are made, and the task making them, which ends with the export's outcome.
pub struct Export {
    pub closed: bool,
    pub chunks: mpsc::Receiver<Chunk>,
    pub done: tokio::task::JoinHandle<Result<(), ExportError>>,
}

impl super::Services {
    /// Start exporting `period` (every org's lines, or `only` that org's).
    pub async fn export(
        &self,
        period: Interval,
        by: By,
        format: Format,
        only: Option<String>,
    ) -> Result<Export, ExportError> {
        let now = self.clock.now();
        let q = line_query(&self.db, period, now).await?;
        let closed = q.closed;
        let (tx, chunks) = mpsc::channel::<Chunk>(4);
        let s = self.clone();
        let done = tokio::spawn(async move {
            produce(&s.db, &s.plans, q, by, format, now, only.as_deref(), tx).await
        });
        Ok(Export {
            closed,
            chunks,
            done,
        })
    }

    /// The closed billing periods, newest first.
    pub async fn closed_periods(&self) -> Result<Vec<PeriodRow>, StoreError> {
        self.db.list_periods().await
    }

    /// Close `month` and any open month before it (`close_through`).
    pub async fn close_periods_through(
        &self,
        month: Interval,
        actor: &rush_meter_core::audit::Actor,
    ) -> Result<Vec<PeriodRow>, ExportError> {
        close_through(&self.db, &self.plans, month, self.clock.now(), actor).await
    }
}
