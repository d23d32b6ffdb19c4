//! SQLite's statements of the gate. They go row by row: SQLite runs them in-process,
//! under the write lock that BEGIN IMMEDIATE already holds, so a round trip costs
//! microseconds.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::*;

/// The slots a key holds (the SQL twin of `gate::holds_slot`), with the lease's start as
/// parameter `$since` and the key as `key_where` (`org_id = … AND key_id = …`): its running
/// sessions heard from within the lease, plus its other open sessions whose slot was taken
/// within it. Two disjoint counts, each a range of a partial index (`sessions_key_running`,
/// `sessions_key_slot`), so the count reads the sessions that may hold a slot, never the
/// key's parked or ended ones. (PostgreSQL counts by phase instead: pg/gate.rs.)
fn slots_held(key_where: &str, since: usize) -> String {
    let heard = format!("phase = 'running' AND COALESCE(heard_at, last_at) >= ${since}");
    format!(
        "(SELECT COUNT(*) FROM sessions WHERE {key_where} AND {heard}) + \
         (SELECT COUNT(*) FROM sessions WHERE {key_where} AND phase <> 'ended' \
            AND slot_at >= ${since} AND slot_at < 4611686018427387904 AND NOT ({heard}) \
            AND (phase = 'admitted' OR heard_at IS NULL OR heard_at <= slot_at))"
    )
}

impl GateRows for Lite {
    async fn lock_keys(
        tx: &mut Tx,
        _orgs: &[&str],
        keys: &[(&str, &str)],
    ) -> StoreResult<Vec<Key>> {
        let mut rows = Vec::with_capacity(keys.len());
        for (org, key) in keys {
            rows.extend(
                sqlx::query_as::<_, Rec<Key>>(
                    "SELECT * FROM api_keys WHERE org_id = $1 AND key_id = $2",
                )
                .bind(*org)
                .bind(*key)
                .fetch_optional(&mut **tx)
                .await?
                .map(|r| r.0),
            );
        }
        Ok(rows)
    }

    async fn slot_counts(
        tx: &mut Tx,
        _orgs: &[&str],
        keys: &[(&str, &str)],
        since: Secs,
    ) -> StoreResult<Vec<SlotCount>> {
        let sql = format!("SELECT {}", slots_held("org_id = $2 AND key_id = $3", 1));
        let mut counts = Vec::with_capacity(keys.len());
        for (org, key) in keys {
            let n: i64 = sqlx::query_scalar(&sql)
                .bind(since)
                .bind(*org)
                .bind(*key)
                .fetch_one(&mut **tx)
                .await?;
            counts.push((org.to_string(), key.to_string(), n));
        }
        Ok(counts)
    }

    /// Write what a group of admissions decided, as PostgreSQL does on Citus (`values`).
    async fn write_admissions(
        &self,
        tx: &mut Tx,
        _orgs: &[&str],
        created: &[Session],
        resumed: &[Session],
        decisions: &[&Decision],
    ) -> StoreResult<bool> {
        write_admissions(tx, created, resumed, decisions).await
    }
}
