//! PostgreSQL's set-based statements of the gate: keys locked, slots counted (on one
//! database with which named sessions exist and the first reads), and a group's
//! admissions written in one statement.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::params::Params;
use super::*;

/// The open phases, bound in this order as the slot count's phase parameters.
pub(super) const OPEN_PHASES: [Phase; 4] = [
    Phase::Running,
    Phase::Admitted,
    Phase::Parked,
    Phase::Silent,
];

/// The slots a key holds (the SQL twin of `gate::holds_slot`), with the lease's start as
/// parameter `$since`, the key as `key_where` (`org_id = … AND key_id = …`) and the open
/// phases (`OPEN_PHASES`) as the four parameters from `$phases`: its running sessions heard
/// from within the lease or holding a slot taken since they were last heard, plus its other
/// open sessions whose slot was taken within the lease. One count a phase, each a range of
/// `sessions_org_phase_key` (org_id, phase, key_id, slot_at), so the count reads the
/// sessions that may hold a slot, never the key's parked or ended history (migration 0012).
/// The phases are parameters, not literals, so that a generic plan (`begin_hot`) cannot
/// take the fleet's partial index over open phases (`sessions_open`) for a rare one. The
/// far upper bound on `slot_at` (no slot is taken in 2^62 s) makes `slot_at >= $since` a
/// range to a generic plan, which otherwise guesses a third of the table.
fn slots_held(key_where: &str, since: usize, phases: usize) -> String {
    let count = |phase: usize, rest: &str| {
        format!("(SELECT COUNT(*) FROM sessions WHERE {key_where} AND phase = ${phase} AND {rest})")
    };
    let slot = format!("slot_at >= ${since} AND slot_at < 4611686018427387904");
    let slot_since_heard = format!("{slot} AND (heard_at IS NULL OR heard_at <= slot_at)");
    [
        count(
            phases,
            &format!("(COALESCE(heard_at, last_at) >= ${since} OR ({slot_since_heard}))"),
        ),
        count(phases + 1, &slot),
        count(phases + 2, &slot_since_heard),
        count(phases + 3, &slot_since_heard),
    ]
    .join(" + ")
}

/// The key lock's statement, with the shard's orgs as `$orgs` and the keys' orgs and ids as
/// `$keys` and the next: rows in byte order (as the caller sorted them, whatever the
/// database's collation), so that gate writers on several instances never deadlock.
fn lock_keys_sql(orgs: usize, keys: usize) -> String {
    format!(
        "SELECT k.* FROM api_keys k \
         JOIN UNNEST(${keys}::text[], ${}::text[]) AS u(org_id, key_id) \
           ON k.org_id = u.org_id AND k.key_id = u.key_id \
         WHERE k.org_id = ANY(${orgs}) \
         ORDER BY k.org_id COLLATE \"C\", k.key_id COLLATE \"C\" FOR UPDATE OF k",
        keys + 1
    )
}

/// `lock_keys_sql` for one PostgreSQL: each key found through `api_keys`' primary key and
/// locked as it is found, the keys taken in byte order by the statement itself (a nested
/// loop keeps its outer rows' order), whatever order the arrays come in. The join of
/// `lock_keys_sql` is planned, generically, as a hash join over a scan of every key of the
/// shard's orgs, a cost that grows with the keys the orgs hold; this one reads the keys
/// asked (tests/generic_plans.rs checks the plan). (Citus plans `FOR UPDATE` only in a query it routes whole to one shard, so the
/// other layouts keep the join.)
pub(super) fn lock_keys_by_key_sql(orgs: usize, keys: usize) -> String {
    format!(
        "SELECT k.* FROM (SELECT * FROM UNNEST(${keys}::text[], ${}::text[]) AS a(org_id, key_id) \
           ORDER BY a.org_id COLLATE \"C\", a.key_id COLLATE \"C\") AS u \
         CROSS JOIN LATERAL (SELECT * FROM api_keys k WHERE k.org_id = u.org_id \
           AND k.key_id = u.key_id AND k.org_id = ANY(${orgs}) FOR UPDATE) AS k",
        keys + 1
    )
}

/// `(org_id, key_id)` pairs as two array parameters.
fn key_columns(keys: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    keys.iter()
        .map(|(o, k)| (o.to_string(), k.to_string()))
        .unzip()
}

/// The slot counts' statement: `$1` the lease's start, `$2 $3` the keys' orgs and ids, `$4`
/// the shard's orgs, `$5` to `$8` the open phases (`OPEN_PHASES`).
pub(super) fn slot_counts_sql() -> String {
    format!(
        "SELECT u.org_id, u.key_id, {} FROM UNNEST($2::text[], $3::text[]) AS u(org_id, key_id)",
        slots_held(
            "org_id = ANY($4) AND org_id = u.org_id AND key_id = u.key_id",
            1,
            5
        )
    )
}

/// Every column of `rows`, in `DECISION_COLUMNS` order, as `UNNEST`'s arguments.
fn decision_arrays(p: &mut Params, rows: &[&Decision]) -> String {
    fn limit<'d>(d: &&'d Decision) -> Option<&'d LimitFigures> {
        d.limit.as_ref()
    }
    [
        p.column("text[]", rows, |d| d.org_id.clone()),
        p.column("text[]", rows, |d| d.decision_id.clone()),
        p.column("int8[]", rows, |d| d.decided_at),
        p.column("text[]", rows, |d| d.session_id.clone()),
        p.column("text[]", rows, |d| d.key_id.clone()),
        p.column("text[]", rows, |d| d.decision.as_str()),
        p.column("text[]", rows, |d| d.reason.map(Reason::as_str)),
        p.column("text[]", rows, |d| d.rule.as_str()),
        p.column("text[]", rows, |d| d.plan_id.clone()),
        p.column("bool[]", rows, |d| d.suspended),
        p.column("int8[]", rows, |d| d.month_start),
        p.column("int8[]", rows, |d| d.month_end),
        p.column("int8[]", rows, |d| d.month_used),
        p.column("int8[]", rows, |d| d.month_limit),
        p.column("int8[]", rows, |d| d.week_start),
        p.column("int8[]", rows, |d| d.week_end),
        p.column("int8[]", rows, |d| d.week_used),
        p.column("int8[]", rows, |d| d.week_limit),
        p.column("int8[]", rows, |d| d.running),
        p.column("int8[]", rows, |d| d.concurrency_limit),
        p.column("text[]", rows, |d| d.upgrade_plan.clone()),
        p.column("text[]", rows, |d| d.funded_by.map(Source::as_str)),
        p.column("int8[]", rows, |d| d.plan_room),
        p.column("int8[]", rows, |d| d.grant_room),
        p.column("int8[]", rows, |d| d.overage_room),
        p.column("text[]", rows, |d| limit(d).map(|l| l.kind.as_str())),
        p.column("text[]", rows, |d| limit(d).map(|l| l.member_id.clone())),
        p.column("int8[]", rows, |d| limit(d).map(|l| l.month_used)),
        p.column("int8[]", rows, |d| limit(d).and_then(|l| l.month_limit)),
        p.column("int8[]", rows, |d| limit(d).map(|l| l.week_used)),
        p.column("int8[]", rows, |d| limit(d).and_then(|l| l.week_limit)),
        p.column("int8[]", rows, |d| d.plan_version),
    ]
    .join(", ")
}

impl GateRows for Pg {
    /// Lock and read these keys (of one shard's orgs, `orgs`), in byte order (`lock_keys_sql`).
    async fn lock_keys(tx: &mut Tx, orgs: &[&str], keys: &[(&str, &str)]) -> StoreResult<Vec<Key>> {
        let (key_orgs, ids) = key_columns(keys);
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Key>>(&lock_keys_sql(1, 2))
                .bind(orgs)
                .bind(key_orgs)
                .bind(ids)
                .fetch_all(&mut **tx)
                .await?,
        ))
    }

    /// Slots held per key (0 for a key holding none).
    async fn slot_counts(
        tx: &mut Tx,
        orgs: &[&str],
        keys: &[(&str, &str)],
        since: Secs,
    ) -> StoreResult<Vec<SlotCount>> {
        let (key_orgs, ids) = key_columns(keys);
        let sql = slot_counts_sql();
        let query = sqlx::query_as(&sql)
            .bind(since)
            .bind(key_orgs)
            .bind(ids)
            .bind(orgs);
        Ok(OPEN_PHASES
            .iter()
            .fold(query, |q, p| q.bind(p.as_str()))
            .fetch_all(&mut **tx)
            .await?)
    }

    /// Write what a group of admissions decided in one statement: new sessions (holding their
    /// slot), slots of resumed ones, decision records. False (and the transaction must be
    /// abandoned) if one of the new sessions existed already. On Citus, a statement a table
    /// (`values`).
    async fn write_admissions(
        &self,
        tx: &mut Tx,
        orgs: &[&str],
        created: &[Session],
        resumed: &[Session],
        decisions: &[&Decision],
    ) -> StoreResult<bool> {
        if self.distributed() {
            return write_admissions(tx, created, resumed, decisions).await;
        }
        let mut p = Params::new();
        let new_rows = p.sessions(created);
        let new_slots = p.column("int8[]", created, |r| r.slot_at);
        let resumes = [
            p.column("text[]", resumed, |r| r.session_id.clone()),
            p.column("int8[]", resumed, |r| r.slot_at),
            p.column("text[]", resumed, |r| r.key_id.clone()),
            p.column("text[]", resumed, |r| r.agent.clone()),
            p.column("text[]", resumed, |r| r.project_id.clone()),
            p.column("text[]", resumed, |r| r.started_by.clone()),
            p.column("text[]", resumed, |r| r.org_id.clone()),
        ]
        .join(", ");
        let shard_orgs = p.add("text[]", Pg::id_list(orgs));
        let records = decision_arrays(&mut p, decisions);
        let sql = format!(
            "WITH n AS (INSERT INTO sessions ({SESSION_COLUMNS}, slot_at) \
               SELECT * FROM UNNEST({new_rows}, {new_slots}) ON CONFLICT DO NOTHING RETURNING 1), \
             r AS (UPDATE sessions SET slot_at = u.slot_at, key_id = u.key_id, agent = u.agent, \
               project_id = u.project_id, started_by = u.started_by \
               FROM UNNEST({resumes}) AS u(session_id, slot_at, key_id, agent, project_id, started_by, org_id) \
               WHERE sessions.org_id = ANY({shard_orgs}) AND sessions.org_id = u.org_id \
                 AND sessions.session_id = u.session_id), \
             d AS (INSERT INTO decisions ({DECISION_COLUMNS}) SELECT * FROM UNNEST({records})) \
             SELECT COUNT(*) FROM n"
        );
        let row = sqlx::query_with(&sql, p.args).fetch_one(&mut **tx).await?;
        let inserted: i64 = sqlx::Row::try_get(&row, 0)?;
        Ok(inserted == created.len() as i64)
    }

    /// On one PostgreSQL, in one statement: which named sessions exist, the keys' slot
    /// counts (`slot_counts`) and the group's first reads of window sums and limits
    /// (`GateReads::sql`). Round trips are much of an admission's time; the counts need only
    /// the keys' locks, taken before, and the existence probe and the sums no lock (a
    /// session that appears after the probe is found by the write, which starts the try
    /// over). The reads' rows come back for `GateReads::finish`, beside the sessions and
    /// counts of the same shape. Partitioned and distributed layouts read nothing early:
    /// there the reads go to a shard each.
    async fn early_reads(
        &self,
        tx: &mut Tx,
        ask: &EarlyAsk<'_>,
    ) -> StoreResult<Option<EarlyReads>> {
        use sqlx::Row as _;
        let EarlyAsk {
            sessions,
            shards,
            keys,
            since,
            reads,
        } = *ask;
        let (orgs, reads) = match (shards.values().next(), reads) {
            (Some(orgs), Some(reads))
                if self.on_one_database() && shards.len() == 1 && keys.len() <= CHUNK =>
            {
                (orgs.as_slice(), reads)
            }
            _ => return Ok(None),
        };
        let (key_orgs, key_ids) = key_columns(keys);
        let (session_orgs, session_ids): (Vec<&str>, Vec<&str>) = sessions.iter().copied().unzip();
        let (reads_sql, p) = reads.sql();
        // Parameters: the reads' first, then the lease's start, the keys' orgs and ids, the
        // shard's orgs, the sessions' orgs and ids, the open phases.
        let (since_at, keys_at, orgs_at, sessions_at) = (p, p + 1, p + 3, p + 4);
        let phases_at = sessions_at + 2;
        let padding = "CAST(NULL AS TEXT), CAST(NULL AS TEXT)";
        let zeros = "CAST(0 AS BIGINT), CAST(0 AS BIGINT), CAST(0 AS BIGINT), CAST(0 AS BIGINT)";
        let sql = format!(
            "{reads_sql} \
             UNION ALL SELECT 'session', s.org_id, CAST(NULL AS TEXT), s.session_id, \
               {padding}, CAST(0 AS BIGINT), {zeros} \
               FROM UNNEST(${sessions_at}::text[], ${}::text[]) AS u(org_id, session_id) \
               JOIN sessions s ON s.org_id = ANY(${orgs_at}) AND s.org_id = u.org_id \
                 AND s.session_id = u.session_id \
             UNION ALL SELECT 'slots', u.org_id, CAST(NULL AS TEXT), u.key_id, {padding}, {}, {zeros} \
               FROM UNNEST(${keys_at}::text[], ${}::text[]) AS u(org_id, key_id)",
            sessions_at + 1,
            slots_held(
                &format!("org_id = ANY(${orgs_at}) AND org_id = u.org_id AND key_id = u.key_id"),
                since_at,
                phases_at,
            ),
            keys_at + 1,
        );
        let query = reads
            .bind(sqlx::query(&sql))
            .bind(since)
            .bind(key_orgs)
            .bind(key_ids)
            .bind(orgs)
            .bind(session_orgs)
            .bind(session_ids);
        let rows = OPEN_PHASES
            .iter()
            .fold(query, |q, p| q.bind(p.as_str()))
            .fetch_all(&mut **tx)
            .await?;
        let mut existing = HashSet::new();
        let mut counts = Vec::with_capacity(keys.len());
        for row in &rows {
            match row.try_get::<&str, _>("row_kind")? {
                "session" => {
                    existing.insert((row.try_get("org_id")?, row.try_get("member_id")?));
                }
                "slots" => counts.push((
                    row.try_get("org_id")?,
                    row.try_get("member_id")?,
                    row.try_get(GATE_READ_COLUMNS[0])?,
                )),
                _ => {}
            }
        }
        Ok(Some(EarlyReads {
            existing,
            slots: counts,
            rows,
        }))
    }
}
