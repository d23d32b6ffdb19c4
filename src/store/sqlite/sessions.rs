//! SQLite's statements on session rows, as the ledger books them: a booking's rows
//! (sessions, rollups, spans, funding) in multi-row VALUES, sessions inserted, locked
//! and read, and org ids looked up.

use rush_meter_core::booking::Funding;

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::*;

/// Who pays for what a booking billed: each window's funds and each grant's use as they
/// now stand, and the hours not paid by the plan.
async fn write_funding(tx: &mut Tx, f: &Funding) -> StoreResult<()> {
    for chunk in f.windows.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(format!(
            "INSERT INTO funding_windows ({FUNDING_WINDOW_COLUMNS}) "
        ));
        q.push_values(chunk, |mut b, (org, w)| {
            b.push_bind(org)
                .push_bind(w.kind.as_str())
                .push_bind(w.window.start)
                .push_bind(w.window.end)
                .push_bind(w.funds.plan)
                .push_bind(w.funds.grant)
                .push_bind(w.funds.overage)
                .push_bind(w.funds.grace)
                .push_bind(w.funds.charge_units);
        });
        q.push(FUNDING_WINDOW_UPSERT);
        once(&mut q).execute(&mut **tx).await?;
    }
    for chunk in f.grants.chunks(CHUNK) {
        // One statement for every grant the booking used (SQLite names a VALUES row's
        // columns column1, column2, …).
        let mut q = QueryBuilder::<DB>::new(
            "UPDATE grants SET used_seconds = v.column3, used_up_at = v.column4 FROM (",
        );
        q.push_values(chunk, |mut b, g| {
            b.push_bind(&g.org_id)
                .push_bind(&g.grant_id)
                .push_bind(g.used_seconds)
                .push_bind(g.used_up_at);
        });
        let orgs: Vec<&str> = chunk.iter().map(|g| g.org_id.as_str()).collect();
        q.push(") AS v WHERE grants.org_id IN (SELECT value FROM json_each(")
            .push_bind(Lite::id_list(&orgs))
            .push(")) AND grants.org_id = v.column1 AND grants.grant_id = v.column2");
        once(&mut q).execute(&mut **tx).await?;
    }
    let hourly: Vec<_> = f.hourly.iter().collect();
    for chunk in hourly.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(
            "INSERT INTO funding_hourly (org_id, hour, source, grant_id, seconds, charge_units) ",
        );
        q.push_values(
            chunk,
            |mut b, ((org, hour, source, grant), (secs, units))| {
                b.push_bind(org)
                    .push_bind(*hour)
                    .push_bind(source.as_str())
                    .push_bind(grant)
                    .push_bind(*secs)
                    .push_bind(*units);
            },
        );
        q.push(FUNDING_HOURS_CONFLICT);
        once(&mut q).execute(&mut **tx).await?;
    }
    Ok(())
}

/// The columns of a session row that SQLite indexes among those a booking overwrites.
/// SQLite rewrites the entries of every index that holds a column an UPDATE names in its
/// SET, whether or not its value changed (PostgreSQL compares values: an unchanged row's
/// update is HOT). Named in the ledger's upsert, `phase` and `key_id` would rewrite four
/// index entries a row on every heartbeat (reports/ingest-notes.md). So the upsert leaves them out
/// (`INDEXED_LEFT_OUT`) and `write_indexed_columns` writes them on the rows where they differ.
const INDEXED_COLUMNS: [&str; 2] = ["phase", "key_id"];

/// `SESSION_UPSERT` without the assignments of `INDEXED_COLUMNS`.
static INDEXED_LEFT_OUT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let (head, sets) = SESSION_UPSERT.split_once(" SET ").expect("an upsert's SET");
    let kept: Vec<&str> = sets
        .split(',')
        .map(str::trim)
        .filter(|a| {
            !INDEXED_COLUMNS
                .iter()
                .any(|c| a.starts_with(&format!("{c} = ")))
        })
        .collect();
    format!("{head} SET {}", kept.join(", "))
});

/// The values of `INDEXED_COLUMNS` in a session, in that order.
fn indexed_values(r: &Session) -> [Option<&str>; 2] {
    [Some(r.ledger.phase.as_str()), r.key_id.as_deref()]
}

/// Write the `INDEXED_COLUMNS` of `rows` (all in the table) where the table's differ, and
/// only there: a heartbeat that parks, resumes or ends its session rewrites its index
/// entries, the others none.
async fn write_indexed_columns(tx: &mut Tx, rows: &[Session]) -> StoreResult<()> {
    // A VALUES row's columns are column1, column2, …: the org and id, then the values.
    let value = |i: usize| format!("v.column{}", i + 3);
    let (sets, differs): (Vec<String>, Vec<String>) = INDEXED_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                format!("{c} = {}", value(i)),
                format!("sessions.{c} IS NOT {}", value(i)),
            )
        })
        .unzip();
    let mut q = QueryBuilder::<DB>::new(format!("UPDATE sessions SET {} FROM (", sets.join(", ")));
    q.push_values(rows, |mut b, r| {
        b.push_bind(&r.org_id).push_bind(&r.session_id);
        for v in indexed_values(r) {
            b.push_bind(v);
        }
    });
    let orgs: Vec<&str> = rows.iter().map(|r| r.org_id.as_str()).collect();
    q.push(") AS v WHERE sessions.org_id IN (SELECT value FROM json_each(")
        .push_bind(Lite::id_list(&orgs))
        .push(format!(
            ")) AND sessions.org_id = v.column1 AND sessions.session_id = v.column2 AND ({})",
            differs.join(" OR ")
        ));
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

/// Write whole session rows: overwrite existing ones (`upsert`: all but their
/// `INDEXED_COLUMNS`, then those where they differ, by `write_indexed_columns`), or insert
/// only new ones. Returns the rows written.
pub(super) async fn write_session_rows(
    tx: &mut Tx,
    rows: &[Session],
    upsert: bool,
) -> StoreResult<u64> {
    let mut q = QueryBuilder::<DB>::new(format!("INSERT INTO sessions ({SESSION_COLUMNS}) "));
    q.push_values(rows, |mut b, r| {
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
    });
    q.push(if upsert {
        INDEXED_LEFT_OUT.as_str()
    } else {
        " ON CONFLICT DO NOTHING"
    });
    let written = once(&mut q).execute(&mut **tx).await?.rows_affected();
    if upsert {
        write_indexed_columns(tx, rows).await?;
    }
    Ok(written)
}

async fn add_org_hours(
    tx: &mut Tx,
    shard: i64,
    rows: &[(&(String, Secs), &i64)],
) -> StoreResult<()> {
    let mut q = QueryBuilder::<DB>::new("INSERT INTO org_hourly (org_id, hour, shard, seconds) ");
    q.push_values(rows, |mut b, ((org, hour), secs)| {
        b.push_bind(org)
            .push_bind(*hour)
            .push_bind(shard)
            .push_bind(*secs);
    });
    q.push(ORG_HOURS_CONFLICT);
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

async fn add_session_hours(
    tx: &mut Tx,
    rows: &[(&(String, Secs, String), &i64)],
) -> StoreResult<()> {
    let mut q =
        QueryBuilder::<DB>::new("INSERT INTO session_hourly (org_id, hour, session_id, seconds) ");
    q.push_values(rows, |mut b, ((org, hour, session), secs)| {
        b.push_bind(org)
            .push_bind(*hour)
            .push_bind(session)
            .push_bind(*secs);
    });
    q.push(SESSION_HOURS_CONFLICT);
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

async fn insert_spans(
    tx: &mut Tx,
    rows: &[(String, String, rush_meter_core::ledger::Span)],
) -> StoreResult<()> {
    let mut q =
        QueryBuilder::<DB>::new("INSERT INTO spans (org_id, session_id, start_at, end_at, kind) ");
    q.push_values(rows, |mut b, (org, session, span)| {
        b.push_bind(org)
            .push_bind(session)
            .push_bind(span.interval.start)
            .push_bind(span.interval.end)
            .push_bind(span_kind(span.kind));
    });
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

/// The sessions with these ids of these orgs (the single writer holds the lock already).
pub(super) async fn select_sessions_for_update(
    tx: &mut Tx,
    orgs: &[&str],
    pairs: &[(&str, &str)],
) -> StoreResult<Vec<Rec<Session>>> {
    // By id alone (`sessions_by_id`), the orgs kept here: SQLite would probe every pair of
    // `org_id IN (…) AND session_id IN (…)` in the primary key.
    let ids: Vec<&str> = pairs.iter().map(|(id, _)| *id).collect();
    let mut q = select_in(
        "SELECT * FROM sessions WHERE session_id",
        &ids,
        " ORDER BY session_id",
    );
    let rows: Vec<Rec<Session>> = q
        .build_query_as()
        .persistent(false)
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|Rec(s)| orgs.binary_search(&s.org_id.as_str()).is_ok())
        .collect())
}

impl SessionRows for Lite {
    /// Write what one transaction books: session rows, both rollups, closed spans.
    async fn write_booking(tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
        let sessions: Vec<Session> = b.sessions.values().cloned().collect();
        let org_hours: Vec<(&(String, Secs), &i64)> = b.org_hours.iter().collect();
        let session_hours: Vec<(&(String, Secs, String), &i64)> = b.session_hours.iter().collect();
        let spans = &b.spans;
        for chunk in sessions.chunks(CHUNK) {
            write_session_rows(tx, chunk, true).await?;
        }
        for chunk in org_hours.chunks(CHUNK) {
            add_org_hours(tx, shard, chunk).await?;
        }
        for chunk in session_hours.chunks(CHUNK) {
            add_session_hours(tx, chunk).await?;
        }
        for chunk in spans.chunks(CHUNK) {
            insert_spans(tx, chunk).await?;
        }
        write_funding(tx, &b.funding).await?;
        let members: Vec<_> = b.member_hours.iter().collect();
        for chunk in members.chunks(CHUNK) {
            let mut q = QueryBuilder::<DB>::new(
                "INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds) ",
            );
            q.push_values(chunk, |mut b, ((org, bucket, dim, member), secs)| {
                b.push_bind(org)
                    .push_bind(dim.as_str())
                    .push_bind(*bucket)
                    .push_bind(member)
                    .push_bind(**secs);
            });
            q.push(MEMBER_HOURS_CONFLICT);
            once(&mut q).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Insert sessions first seen now, skipping any that exist; returns how many were inserted.
    async fn insert_new_session_rows(tx: &mut Tx, rows: &[Session]) -> StoreResult<u64> {
        write_session_rows(tx, rows, false).await
    }

    /// Up to `limit` sessions of `orgs` where `condition` (ending in a comparison with
    /// `since`) holds.
    async fn lock_sessions_where(
        tx: &mut Tx,
        orgs: &[&str],
        condition: &str,
        since: Secs,
        limit: i64,
    ) -> StoreResult<Vec<Rec<Session>>> {
        let mut q = select_in("SELECT * FROM sessions WHERE org_id", orgs, " AND ");
        q.push(condition);
        q.push_bind(since);
        q.push(" ORDER BY session_id LIMIT ");
        q.push_bind(limit);
        Ok(q.build_query_as::<Rec<Session>>()
            .persistent(false)
            .fetch_all(&mut **tx)
            .await?)
    }

    async fn select_org_ids(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
        let mut q = select_in("SELECT org_id FROM orgs WHERE org_id", ids, "");
        Ok(q.build_query_scalar::<String>()
            .persistent(false)
            .fetch_all(&mut **tx)
            .await?)
    }

    async fn select_orgs_in<'e, E: sqlx::Executor<'e, Database = DB>>(
        ex: E,
        ids: &[&str],
    ) -> StoreResult<Vec<Rec<Org>>> {
        let mut q = select_in("SELECT * FROM orgs WHERE org_id", ids, "");
        Ok(q.build_query_as::<Rec<Org>>()
            .persistent(false)
            .fetch_all(ex)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_upsert_leaves_out_only_the_indexed_columns() {
        let sql = INDEXED_LEFT_OUT.as_str();
        assert!(
            sql.starts_with(" ON CONFLICT (org_id, session_id) DO UPDATE SET "),
            "{sql}"
        );
        for c in INDEXED_COLUMNS {
            assert!(!sql.contains(&format!("{c} = ")), "{sql}");
        }
        // Every other assignment of the full upsert is kept.
        let all = SESSION_UPSERT.matches(" = excluded.").count();
        assert_eq!(
            sql.matches(" = excluded.").count(),
            all - INDEXED_COLUMNS.len(),
            "{sql}"
        );
        assert!(sql.contains("last_at = excluded.last_at"), "{sql}");
    }
}
