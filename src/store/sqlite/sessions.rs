//! SQLite's statements on session rows, as the ledger books them: a booking's rows
//! (sessions, rollups, spans, funding) in multi-row VALUES, sessions inserted, locked
//! and read, and org ids looked up.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::*;

/// The columns of a session row that SQLite indexes among those a booking overwrites.
/// SQLite rewrites the entries of every index that holds a column an UPDATE names in its
/// SET, whether or not its value changed (PostgreSQL compares values: an unchanged row's
/// update is HOT). Named in the ledger's upsert, `phase` and `key_id` would rewrite four
/// index entries a row on every heartbeat (reports/ingest-notes.md). So the upsert leaves them out
/// (`INDEXED_LEFT_OUT`) and `write_indexed_columns` writes them on the rows where they differ.
const INDEXED_COLUMNS: [&str; 2] = ["phase", "key_id"];

/// `SESSION_UPSERT` without the assignments of `INDEXED_COLUMNS`, nor the slot's release
/// (`slot_at`, indexed too), which `write_indexed_columns` does where the phase changes.
static INDEXED_LEFT_OUT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let (head, sets) = SESSION_UPSERT.split_once(" SET ").expect("an upsert's SET");
    let kept: Vec<&str> = sets
        .split(',')
        .map(str::trim)
        .filter(|a| {
            !INDEXED_COLUMNS
                .iter()
                .chain(&["slot_at"])
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
    // The slot's release of `SESSION_UPSERT`: SQLite reads the row's old phase here too.
    let release = format!(
        "slot_at = CASE WHEN {} = 'parked' AND sessions.phase <> 'parked' THEN NULL ELSE slot_at END",
        value(0)
    );
    let mut q = QueryBuilder::<DB>::new(format!(
        "UPDATE sessions SET {}, {release} FROM (",
        sets.join(", ")
    ));
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

/// Overwrite whole session rows: all but their `INDEXED_COLUMNS`, then those where they
/// differ (`write_indexed_columns`).
async fn write_session_rows(tx: &mut Tx, rows: &[Session]) -> StoreResult<()> {
    let mut q = session_values(rows, Slot::Without);
    q.push(INDEXED_LEFT_OUT.as_str());
    once(&mut q).execute(&mut **tx).await?;
    write_indexed_columns(tx, rows).await
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
    /// Write what one transaction books: session rows, then the rest as PostgreSQL writes
    /// it on Citus (`values`).
    async fn write_booking(&self, tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
        let sessions: Vec<Session> = b.sessions.values().cloned().collect();
        for chunk in sessions.chunks(CHUNK) {
            write_session_rows(tx, chunk).await?;
        }
        write_booking_rollups(tx, shard, b).await
    }

    /// Insert sessions first seen now, skipping any that exist; returns how many were inserted.
    async fn insert_new_session_rows(&self, tx: &mut Tx, rows: &[Session]) -> StoreResult<u64> {
        insert_sessions(tx, rows, Slot::Without, " ON CONFLICT DO NOTHING").await
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
