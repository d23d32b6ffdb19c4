//! Rows written as multi-row VALUES, a statement a table: how SQLite writes a booking and
//! an admission, and how PostgreSQL does on Citus. Citus routes an `INSERT … VALUES` (or an
//! `UPDATE … FROM (VALUES …)`) of one shard's rows straight to that shard, but runs
//! PostgreSQL's one-statement form (data-modifying CTEs of `INSERT … SELECT FROM UNNEST`)
//! as subplans whose rows pass through the coordinator: several milliseconds a table
//! where an insert of one row costs under one (reports/citus-notes.md).

use std::borrow::Borrow;

use sqlx::query_builder::Separated;
use sqlx::QueryBuilder;

use super::*;

/// A statement built here, prepared once a connection where the backend keeps such
/// statements (`Dialect::KEEP_VALUES`).
pub(crate) fn run<'q, 'a>(
    q: &'q mut QueryBuilder<'a, DB>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'a>> {
    q.build().persistent(D::KEEP_VALUES)
}

/// ` IN (ids…)`: a list Citus prunes shards by, as SQLite reads it.
pub(crate) fn push_in<'a>(q: &mut QueryBuilder<'a, DB>, ids: &'a [&str]) {
    q.push(" IN (");
    let mut sep = q.separated(", ");
    for id in ids {
        sep.push_bind(*id);
    }
    q.push(")");
}

/// A session row's values, in `SESSION_COLUMNS` order.
fn push_session<'a>(b: &mut Separated<'_, 'a, DB, &'static str>, r: &'a Session) {
    b.push_bind(&r.org_id)
        .push_bind(&r.session_id)
        .push_bind(&r.key_id)
        .push_bind(&r.agent)
        .push_bind(&r.project_id)
        .push_bind(&r.started_by)
        .push_bind(&r.vm_id)
        .push_bind(r.ledger.phase.as_str())
        .push_bind(r.ledger.last_seq)
        .push_bind(r.ledger.last_at)
        .push_bind(r.ledger.span_start)
        .push_bind(r.ledger.billed_seconds)
        .push_bind(r.ledger.heartbeats)
        .push_bind(r.ledger.silences)
        .push_bind(r.unadmitted)
        .push_bind(r.created_at)
        .push_bind(r.ledger.ended_at)
        .push_bind(r.ledger.end_status.map(EndStatus::as_str))
        .push_bind(r.heard_at)
        .push_bind(held_columns(&r.ledger.held).0)
        .push_bind(held_columns(&r.ledger.held).1);
}

/// Whether a session insert carries the slot the gate gave it (`slot_at`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Without,
    With,
}

/// `INSERT INTO sessions (…) VALUES …` of `rows`, for the caller to end with its conflict
/// clause.
pub(crate) fn session_values<S: Borrow<Session>>(rows: &[S], slot: Slot) -> QueryBuilder<'_, DB> {
    let slot_column = if slot == Slot::With { ", slot_at" } else { "" };
    let mut q = QueryBuilder::<DB>::new(format!(
        "INSERT INTO sessions ({SESSION_COLUMNS}{slot_column}) "
    ));
    q.push_values(rows, |mut b, r| {
        let r = r.borrow();
        push_session(&mut b, r);
        if slot == Slot::With {
            b.push_bind(r.slot_at);
        }
    });
    q
}

/// Insert `rows` (at most `CHUNK`), ended by `conflict`; the rows written, counted from
/// RETURNING (Citus reports the rows offered to some inserts, not those written:
/// citus#3377).
pub(crate) async fn insert_sessions<S: Borrow<Session>>(
    tx: &mut Tx,
    rows: &[S],
    slot: Slot,
    conflict: &str,
) -> StoreResult<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut q = session_values(rows, slot);
    q.push(conflict).push(" RETURNING 1");
    Ok(run(&mut q).fetch_all(&mut **tx).await?.len() as u64)
}

/// Insert `rows` a `CHUNK` at a time: `head` (`INSERT INTO t (…) `), each row's values as
/// `push` binds them, then `tail` (a conflict clause, or nothing).
async fn insert_values<'a, R>(
    tx: &mut Tx,
    head: &str,
    rows: &'a [R],
    push: impl Fn(&mut Separated<'_, 'a, DB, &'static str>, &'a R),
    tail: &str,
) -> StoreResult<()> {
    for chunk in rows.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(head);
        q.push_values(chunk, |mut b, r| push(&mut b, r));
        q.push(tail);
        run(&mut q).execute(&mut **tx).await?;
    }
    Ok(())
}

/// What a booking writes besides its session rows (which each backend writes its own
/// way): both rollups, closed spans, who pays, and the members' hours.
pub(crate) async fn write_booking_rollups(tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
    let org_hours: Vec<_> = b.org_hours.iter().collect();
    insert_values(
        tx,
        "INSERT INTO org_hourly (org_id, hour, shard, seconds) ",
        &org_hours,
        |b, ((org, hour), secs)| {
            b.push_bind(org)
                .push_bind(*hour)
                .push_bind(shard)
                .push_bind(**secs);
        },
        ORG_HOURS_CONFLICT,
    )
    .await?;
    let session_hours: Vec<_> = b.session_hours.iter().collect();
    insert_values(
        tx,
        "INSERT INTO session_hourly (org_id, hour, session_id, seconds) ",
        &session_hours,
        |b, ((org, hour, session), secs)| {
            b.push_bind(org)
                .push_bind(*hour)
                .push_bind(session)
                .push_bind(**secs);
        },
        SESSION_HOURS_CONFLICT,
    )
    .await?;
    insert_values(
        tx,
        "INSERT INTO spans (org_id, session_id, start_at, end_at, kind) ",
        &b.spans,
        |b, (org, session, span)| {
            b.push_bind(org)
                .push_bind(session)
                .push_bind(span.interval.start)
                .push_bind(span.interval.end)
                .push_bind(span_kind(span.kind));
        },
        "",
    )
    .await?;
    write_funding(tx, &b.funding).await?;
    let members: Vec<_> = b.member_hours.iter().collect();
    insert_values(
        tx,
        "INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds) ",
        &members,
        |b, ((org, bucket, dim, member), secs)| {
            b.push_bind(org)
                .push_bind(dim.as_str())
                .push_bind(*bucket)
                .push_bind(member)
                .push_bind(**secs);
        },
        MEMBER_HOURS_CONFLICT,
    )
    .await
}

/// Who pays for what a booking billed: each window's funds and each grant's use as they
/// now stand, and the hours not paid by the plan.
async fn write_funding(tx: &mut Tx, f: &rush_meter_core::booking::Funding) -> StoreResult<()> {
    insert_values(
        tx,
        &format!("INSERT INTO funding_windows ({FUNDING_WINDOW_COLUMNS}) "),
        &f.windows,
        |b, (org, w)| {
            b.push_bind(org)
                .push_bind(w.kind.as_str())
                .push_bind(w.window.start)
                .push_bind(w.window.end)
                .push_bind(w.funds.plan)
                .push_bind(w.funds.grant)
                .push_bind(w.funds.overage)
                .push_bind(w.funds.grace)
                .push_bind(w.funds.charge_units);
        },
        FUNDING_WINDOW_UPSERT,
    )
    .await?;
    for chunk in f.grants.chunks(CHUNK) {
        // One statement for every grant the booking used (both databases name a VALUES
        // row's columns column1, column2, …); the orgs listed, so that Citus routes it.
        let mut q = QueryBuilder::<DB>::new(
            "UPDATE grants SET used_seconds = v.column3, used_up_at = v.column4 FROM (",
        );
        q.push_values(chunk, |mut b, g| {
            b.push_bind(&g.org_id)
                .push_bind(&g.grant_id)
                .push_bind(g.used_seconds)
                .push_bind(g.used_up_at);
        });
        let orgs = sorted_unique(chunk.iter().map(|g| g.org_id.as_str()));
        q.push(") AS v WHERE grants.org_id");
        push_in(&mut q, &orgs);
        q.push(" AND grants.org_id = v.column1 AND grants.grant_id = v.column2");
        run(&mut q).execute(&mut **tx).await?;
    }
    let hourly: Vec<_> = f.hourly.iter().collect();
    insert_values(
        tx,
        "INSERT INTO funding_hourly (org_id, hour, source, grant_id, seconds, charge_units) ",
        &hourly,
        |b, ((org, hour, source, grant), (secs, units))| {
            b.push_bind(org)
                .push_bind(*hour)
                .push_bind(source.as_str())
                .push_bind(grant)
                .push_bind(*secs)
                .push_bind(*units);
        },
        FUNDING_HOURS_CONFLICT,
    )
    .await
}

/// Write what a group of admissions decided (one shard's, at most `CHUNK` of each): new
/// sessions holding their slot, the slots of resumed ones, the decision records. False
/// (and the transaction must be abandoned) if one of the new sessions existed already.
pub(crate) async fn write_admissions(
    tx: &mut Tx,
    created: &[Session],
    resumed: &[Session],
    decisions: &[&Decision],
) -> StoreResult<bool> {
    let inserted = insert_sessions(tx, created, Slot::With, " ON CONFLICT DO NOTHING").await?;
    if inserted < created.len() as u64 {
        return Ok(false);
    }
    for r in resumed {
        sqlx::query(
            "UPDATE sessions SET slot_at = $1, key_id = $2, agent = $3, project_id = $4, \
               started_by = $5 WHERE org_id = $6 AND session_id = $7",
        )
        .bind(r.slot_at)
        .bind(&r.key_id)
        .bind(&r.agent)
        .bind(&r.project_id)
        .bind(&r.started_by)
        .bind(&r.org_id)
        .bind(&r.session_id)
        .execute(&mut **tx)
        .await?;
    }
    if !decisions.is_empty() {
        insert_decisions(tx, decisions).await?;
    }
    Ok(true)
}

async fn insert_decisions(tx: &mut Tx, rows: &[&Decision]) -> StoreResult<()> {
    let head = format!("INSERT INTO decisions ({DECISION_COLUMNS}) ");
    insert_values(
        tx,
        &head,
        rows,
        |b, d| {
            let limit = d.limit.as_ref();
            b.push_bind(&d.org_id)
                .push_bind(&d.decision_id)
                .push_bind(d.decided_at)
                .push_bind(&d.session_id)
                .push_bind(&d.key_id)
                .push_bind(d.decision.as_str())
                .push_bind(d.reason.map(Reason::as_str))
                .push_bind(d.rule.as_str())
                .push_bind(&d.plan_id)
                .push_bind(d.suspended)
                .push_bind(d.month_start)
                .push_bind(d.month_end)
                .push_bind(d.month_used)
                .push_bind(d.month_limit)
                .push_bind(d.week_start)
                .push_bind(d.week_end)
                .push_bind(d.week_used)
                .push_bind(d.week_limit)
                .push_bind(d.running)
                .push_bind(d.concurrency_limit)
                .push_bind(&d.upgrade_plan)
                .push_bind(d.funded_by.map(Source::as_str))
                .push_bind(d.plan_room)
                .push_bind(d.grant_room)
                .push_bind(d.overage_room)
                .push_bind(limit.map(|l| l.kind.as_str()))
                .push_bind(limit.map(|l| l.member_id.as_str()))
                .push_bind(limit.map(|l| l.month_used))
                .push_bind(limit.and_then(|l| l.month_limit))
                .push_bind(limit.map(|l| l.week_used))
                .push_bind(limit.and_then(|l| l.week_limit))
                .push_bind(d.plan_version);
        },
        "",
    )
    .await
}
