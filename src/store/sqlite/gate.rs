//! SQLite's statements of the gate. They go row by row: SQLite runs them in-process,
//! under the write lock that BEGIN IMMEDIATE already holds, so a round trip costs
//! microseconds.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::sessions::write_session_rows;
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

async fn set_slots(tx: &mut Tx, rows: impl Iterator<Item = &Session>) -> StoreResult<()> {
    for r in rows {
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
    Ok(())
}

async fn insert_decisions(tx: &mut Tx, rows: &[&Decision]) -> StoreResult<()> {
    let mut q = QueryBuilder::<DB>::new(format!("INSERT INTO decisions ({DECISION_COLUMNS}) "));
    q.push_values(rows, |mut b, d| {
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
            .push_bind(d.limit.as_ref().map(|l| l.kind.as_str()))
            .push_bind(d.limit.as_ref().map(|l| l.member_id.clone()))
            .push_bind(d.limit.as_ref().map(|l| l.month_used))
            .push_bind(d.limit.as_ref().and_then(|l| l.month_limit))
            .push_bind(d.limit.as_ref().map(|l| l.week_used))
            .push_bind(d.limit.as_ref().and_then(|l| l.week_limit));
    });
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
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

    /// Write what a group of admissions decided: new sessions, slots, decision records. False
    /// (and the transaction must be abandoned) if one of the new sessions existed already.
    async fn write_admissions(
        tx: &mut Tx,
        _orgs: &[&str],
        created: &[Session],
        resumed: &[Session],
        decisions: &[&Decision],
    ) -> StoreResult<bool> {
        if !created.is_empty()
            && write_session_rows(tx, created, false).await? < created.len() as u64
        {
            return Ok(false);
        }
        set_slots(tx, created.iter().chain(resumed)).await?;
        if !decisions.is_empty() {
            insert_decisions(tx, decisions).await?;
        }
        Ok(true)
    }
}
