//! PostgreSQL's set-based statements of the gate: keys locked, slots counted (with the
//! claim of new session ids, on one database), and a group's admissions written in one
//! statement.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::sessions::{bind_sessions, claim_owners, column, SESSION_ARRAYS};
use super::*;

impl Pg {
    /// Claim session ids (`claim_owners`) and, on one PostgreSQL, count the keys' slots
    /// (`slot_counts`) in the same statement: a group's round trips are much of an
    /// admission's time (issue 18), and the counts need only the keys' locks, taken
    /// before. Partitioned and distributed layouts count a shard at a time, after it
    /// (`None`): there the claim and the counts go to different shards.
    pub(super) async fn claim_owners_counting_slots(
        &self,
        tx: &mut Tx,
        wanted: &[(&str, &str)],
        shards: &BTreeMap<i64, Vec<&str>>,
        keys: &[(&str, &str)],
        since: Secs,
    ) -> StoreResult<(Vec<String>, Option<Vec<SlotCount>>)> {
        let one = *self.sharding.read().expect("sharding lock") == Sharding::One;
        let orgs = match shards.values().next() {
            Some(orgs) if one && shards.len() == 1 && keys.len() <= CHUNK => orgs.as_slice(),
            _ => return Ok((claim_owners(tx, wanted).await?, None)),
        };
        let (key_orgs, key_ids) = key_columns(keys);
        let (owner_orgs, ids): (Vec<&str>, Vec<&str>) = wanted.iter().copied().unzip();
        // A claimed id comes back as a row without an org.
        let sql = format!(
            "WITH c AS (INSERT INTO session_owners (org_id, session_id) \
               SELECT * FROM UNNEST($5::text[], $6::text[]) ON CONFLICT DO NOTHING \
               RETURNING session_id) \
             SELECT CAST(NULL AS TEXT), session_id, CAST(0 AS BIGINT) FROM c \
             UNION ALL {}",
            slot_counts_sql()
        );
        let rows: Vec<(Option<String>, String, i64)> = sqlx::query_as(&sql)
            .bind(since)
            .bind(key_orgs)
            .bind(key_ids)
            .bind(orgs)
            .bind(owner_orgs)
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?;
        let mut claimed = Vec::with_capacity(wanted.len());
        let mut counts = Vec::with_capacity(keys.len());
        for (org, id, n) in rows {
            match org {
                None => claimed.push(id),
                Some(org) => counts.push((org, id, n)),
            }
        }
        Ok((claimed, Some(counts)))
    }
}

/// `(org_id, key_id)` pairs as two array parameters.
fn key_columns(keys: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    keys.iter()
        .map(|(o, k)| (o.to_string(), k.to_string()))
        .unzip()
}

/// Lock and read these keys (of one shard's orgs, `orgs`), in byte order (as the caller
/// sorted them, whatever the database's collation), so that gate writers on several
/// instances never deadlock.
pub(super) async fn lock_keys(
    tx: &mut Tx,
    orgs: &[&str],
    keys: &[(&str, &str)],
) -> StoreResult<Vec<Key>> {
    let (key_orgs, ids) = key_columns(keys);
    Ok(unwrap_all(
        sqlx::query_as::<_, Rec<Key>>(
            "SELECT k.* FROM api_keys k JOIN UNNEST($1::text[], $2::text[]) AS u(org_id, key_id) \
               ON k.org_id = u.org_id AND k.key_id = u.key_id \
             WHERE k.org_id = ANY($3) \
             ORDER BY k.org_id COLLATE \"C\", k.key_id COLLATE \"C\" FOR UPDATE OF k",
        )
        .bind(key_orgs)
        .bind(ids)
        .bind(orgs)
        .fetch_all(&mut **tx)
        .await?,
    ))
}

/// The slot counts' statement: `$1` the lease's start, `$2 $3` the keys' orgs and ids, `$4`
/// the shard's orgs.
pub(super) fn slot_counts_sql() -> String {
    format!(
        "SELECT u.org_id, u.key_id, {} FROM UNNEST($2::text[], $3::text[]) AS u(org_id, key_id)",
        slots_held("org_id = ANY($4) AND org_id = u.org_id AND key_id = u.key_id")
    )
}

/// Slots held per key (0 for a key holding none).
pub(super) async fn slot_counts(
    tx: &mut Tx,
    orgs: &[&str],
    keys: &[(&str, &str)],
    since: Secs,
) -> StoreResult<Vec<SlotCount>> {
    let (key_orgs, ids) = key_columns(keys);
    Ok(sqlx::query_as(&slot_counts_sql())
        .bind(since)
        .bind(key_orgs)
        .bind(ids)
        .bind(orgs)
        .fetch_all(&mut **tx)
        .await?)
}

/// Write what a group of admissions decided in one statement: new sessions (holding their
/// slot), slots of resumed ones, decision records. False (and the transaction must be
/// abandoned) if one of the new sessions existed already.
pub(super) async fn write_admissions(
    tx: &mut Tx,
    orgs: &[&str],
    created: &[Session],
    resumed: &[Session],
    decisions: &[&Decision],
) -> StoreResult<bool> {
    let sql = format!(
        "WITH n AS (INSERT INTO sessions ({SESSION_COLUMNS}, slot_at) \
           SELECT * FROM UNNEST({SESSION_ARRAYS}, $20::int8[]) ON CONFLICT DO NOTHING RETURNING 1), \
         r AS (UPDATE sessions SET slot_at = u.slot_at, key_id = u.key_id, agent = u.agent, \
           project_id = u.project_id, started_by = u.started_by \
           FROM UNNEST($21::text[], $22::int8[], $23::text[], $24::text[], $25::text[], $26::text[], \
             $48::text[]) AS u(session_id, slot_at, key_id, agent, project_id, started_by, org_id) \
           WHERE sessions.org_id = ANY($49) AND sessions.org_id = u.org_id \
             AND sessions.session_id = u.session_id), \
         d AS (INSERT INTO decisions ({DECISION_COLUMNS}) SELECT * FROM UNNEST($27::text[], \
           $28::text[], $29::int8[], $30::text[], $31::text[], $32::text[], $33::text[], \
           $34::text[], $35::text[], $36::bool[], $37::int8[], $38::int8[], $39::int8[], \
           $40::int8[], $41::int8[], $42::int8[], $43::int8[], $44::int8[], $45::int8[], \
           $46::int8[], $47::text[], $50::text[], $51::int8[], $52::int8[], $53::int8[], \
           $54::text[], $55::text[], $56::int8[], $57::int8[], $58::int8[], $59::int8[])) \
         SELECT COUNT(*) FROM n"
    );
    fn col<T>(rows: &[&Decision], f: impl Fn(&Decision) -> T) -> Vec<T> {
        rows.iter().map(|r| f(r)).collect()
    }
    let rows = decisions;
    let row = bind_sessions(sqlx::query(&sql), created)
        .bind(column(created, |r| r.slot_at))
        .bind(column(resumed, |r| r.session_id.clone()))
        .bind(column(resumed, |r| r.slot_at))
        .bind(column(resumed, |r| r.key_id.clone()))
        .bind(column(resumed, |r| r.agent.clone()))
        .bind(column(resumed, |r| r.project_id.clone()))
        .bind(column(resumed, |r| r.started_by.clone()))
        .bind(col(rows, |d| d.org_id.clone()))
        .bind(col(rows, |d| d.decision_id.clone()))
        .bind(col(rows, |d| d.decided_at))
        .bind(col(rows, |d| d.session_id.clone()))
        .bind(col(rows, |d| d.key_id.clone()))
        .bind(col(rows, |d| d.decision.clone()))
        .bind(col(rows, |d| d.reason.clone()))
        .bind(col(rows, |d| d.rule.clone()))
        .bind(col(rows, |d| d.plan_id.clone()))
        .bind(col(rows, |d| d.suspended))
        .bind(col(rows, |d| d.month_start))
        .bind(col(rows, |d| d.month_end))
        .bind(col(rows, |d| d.month_used))
        .bind(col(rows, |d| d.month_limit))
        .bind(col(rows, |d| d.week_start))
        .bind(col(rows, |d| d.week_end))
        .bind(col(rows, |d| d.week_used))
        .bind(col(rows, |d| d.week_limit))
        .bind(col(rows, |d| d.running))
        .bind(col(rows, |d| d.concurrency_limit))
        .bind(col(rows, |d| d.upgrade_plan.clone()))
        .bind(column(resumed, |r| r.org_id.clone()))
        .bind(orgs)
        .bind(col(rows, |d| d.funded_by.clone()))
        .bind(col(rows, |d| d.plan_room))
        .bind(col(rows, |d| d.grant_room))
        .bind(col(rows, |d| d.overage_room))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.kind.clone())))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.member_id.clone())))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.month_used)))
        .bind(col(rows, |d| d.limit.as_ref().and_then(|l| l.month_limit)))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.week_used)))
        .bind(col(rows, |d| d.limit.as_ref().and_then(|l| l.week_limit)))
        .fetch_one(&mut **tx)
        .await?;
    let inserted: i64 = sqlx::Row::try_get(&row, 0)?;
    Ok(inserted == created.len() as i64)
}
