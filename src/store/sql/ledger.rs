//! The ledger (`LedgerStore`), written once for both dialects: locks and reads around the
//! core's rules (`core::heartbeats::group`, `core::ledger`), and the readers' sums.

use super::*;

pub(crate) fn span_kind(kind: VmState) -> &'static str {
    kind.as_str()
}

pub(crate) const SESSION_COLUMNS: &str =
    "org_id, session_id, key_id, agent, project_id, started_by, \
     vm_id, phase, last_seq, last_at, span_start, billed_seconds, heartbeats, silences, \
     unadmitted, created_at, ended_at, end_status, heard_at, held_at, held";

/// Overwrites every column of a locked session row with the new state, and clears the
/// slot of a session the write parks. A parked session holds no slot (docs/gate.md,
/// "Slots"), but the gate's count judges one by its heard and slot times, in whole seconds:
/// admitted and parked within one second, it would look admitted after it parked and keep
/// its slot for the lease. Cleared, the order is never guessed; a resume sets it again.
/// `slot_at` changes only when the phase does, which is indexed too, so PostgreSQL's
/// heartbeat updates stay HOT.
pub(crate) const SESSION_UPSERT: &str = " ON CONFLICT (org_id, session_id) DO UPDATE SET \
     key_id = excluded.key_id, agent = excluded.agent, project_id = excluded.project_id, \
     started_by = excluded.started_by, vm_id = excluded.vm_id, phase = excluded.phase, \
     last_seq = excluded.last_seq, last_at = excluded.last_at, \
     span_start = excluded.span_start, billed_seconds = excluded.billed_seconds, \
     heartbeats = excluded.heartbeats, silences = excluded.silences, \
     unadmitted = excluded.unadmitted, ended_at = excluded.ended_at, \
     end_status = excluded.end_status, heard_at = excluded.heard_at, \
     held_at = excluded.held_at, held = excluded.held, \
     slot_at = CASE WHEN excluded.phase = 'parked' AND sessions.phase <> 'parked' \
     THEN NULL ELSE sessions.slot_at END";

pub(crate) const ORG_HOURS_CONFLICT: &str = " ON CONFLICT (org_id, hour, shard) DO UPDATE \
     SET seconds = org_hourly.seconds + excluded.seconds";

pub(crate) const MEMBER_HOURS_CONFLICT: &str =
    " ON CONFLICT (org_id, dimension, bucket, member_id) DO UPDATE \
     SET seconds = member_hourly.seconds + excluded.seconds";

pub(crate) const SESSION_HOURS_CONFLICT: &str =
    " ON CONFLICT (org_id, hour, session_id) DO UPDATE \
     SET seconds = session_hourly.seconds + excluded.seconds";

/// Sorted ids of the orgs that exist among `ids`.
async fn existing_orgs(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
    let mut found = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        found.extend(D::select_org_ids(tx, chunk).await?);
    }
    found.sort_unstable();
    Ok(found)
}

/// One try of a heartbeat group, in phases: lock the sessions it names, screen its
/// requests and create the sessions first seen, apply the heartbeats (the core), and fund
/// and book what they billed. `None` when another writer created one of its new sessions
/// first (start over and see it).
async fn ingest_once(
    store: &D,
    requests: &[Vec<Heartbeat>],
    rules: &Rules,
    plans: &Plans,
    now: Secs,
    shard: i64,
) -> StoreResult<Option<Vec<RequestOutcome>>> {
    let mut tx = store.begin_hot().await?;
    let named: Vec<(&str, &str)> = requests
        .iter()
        .flatten()
        .map(|h| (h.org_id.as_str(), h.session_id.as_str()))
        .collect();
    let mut sessions = store.lock_sessions(&mut tx, &named).await?;
    let Some(verdicts) = screen_phase(store, &mut tx, requests, &mut sessions).await? else {
        return Ok(None);
    };
    let (answers, booking) = heartbeats::apply(requests, verdicts, &mut sessions, rules);
    store
        .fund_and_book(&mut tx, shard, booking, plans, now, rules)
        .await?;
    tx.commit().await?;
    Ok(Some(answers))
}

/// A heartbeat group in one transaction, tried again as `retry_group` says.
async fn ingest_retried(
    store: &D,
    requests: &[Vec<Heartbeat>],
    rules: &Rules,
    plans: &Plans,
    now: Secs,
    shard: i64,
) -> StoreResult<Vec<RequestOutcome>> {
    retry_group("sessions kept changing owner during ingest", || {
        ingest_once(store, requests, rules, plans, now, shard)
    })
    .await
}

/// A group whose orgs lie on several shards, where the store commits a shard at a time
/// (`Dialect::commits_by_shard`): each request is judged whole first (`shards::check`),
/// then each shard's part is applied in a transaction of its own (`shards::split`). A part
/// that fails fails the group after others may have committed; the request is answered
/// 503, and its retry applies what was not applied, once (its heartbeats' seqs).
async fn ingest_by_shard(
    store: &D,
    requests: &[Vec<Heartbeat>],
    orgs: &[&str],
    shard_of: &HashMap<&str, i64>,
    (rules, plans, now, writer): (&Rules, &Plans, Secs, i64),
) -> StoreResult<Vec<RequestOutcome>> {
    use heartbeats::shards;
    let (seen, unseen) = store.split_seen(orgs);
    let mut reads: Vec<BoxFuture<'_, StoreResult<Vec<String>>>> = Vec::new();
    for part in store.parts_by_shard(&unseen).await? {
        reads.push(Box::pin(async move {
            let mut found = Vec::with_capacity(part.len());
            for chunk in part.chunks(CHUNK) {
                let rows = D::select_orgs_in(store.read(), chunk).await?;
                found.extend(rows.into_iter().map(|Rec(o)| o.org_id));
            }
            Ok(found)
        }));
    }
    let read: Vec<String> = shards_at_once(reads).await?.concat();
    store.remember_orgs(&read);
    let found: Vec<String> = seen.into_iter().map(str::to_owned).chain(read).collect();
    let verdicts = shards::check(requests, &found);
    let parts = shards::split(requests, &verdicts, |o| shard_of[o]);
    let work: Vec<BoxFuture<'_, _>> = parts
        .iter()
        .map(|p| {
            Box::pin(ingest_retried(
                store,
                &p.requests,
                rules,
                plans,
                now,
                writer,
            )) as BoxFuture<'_, _>
        })
        .collect();
    let answers = shards_at_once(work).await?;
    Ok(shards::merge(requests, verdicts, &parts, answers))
}

/// Phase two of a heartbeat group: each request screened whole (`heartbeats::screen`),
/// the orgs of sessions first seen looked up, and those sessions created (`sessions` gains
/// them). `None` when another writer created one of them first.
async fn screen_phase(
    store: &D,
    tx: &mut Tx,
    requests: &[Vec<Heartbeat>],
    sessions: &mut HashMap<SessionKey, Session>,
) -> StoreResult<Option<Vec<Result<(), heartbeats::IngestReject>>>> {
    let unproven = heartbeats::unproven_orgs(requests, sessions);
    let found = if unproven.is_empty() {
        Vec::new()
    } else {
        existing_orgs(tx, &unproven).await?
    };
    let screened = heartbeats::screen(requests, sessions, &found);
    if !screened.created.is_empty() {
        let new: Vec<Session> = screened.created.values().cloned().collect();
        if !store.insert_new_sessions(tx, new).await? {
            return Ok(None);
        }
        sessions.extend(screened.created);
    }
    Ok(Some(screened.verdicts))
}

impl D {
    /// Fund what a booking billed (under its orgs' row locks), then write it, one shard's
    /// rows at a time.
    pub(crate) async fn fund_and_book(
        &self,
        tx: &mut Tx,
        shard: i64,
        mut booking: Booking,
        plans: &Plans,
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<()> {
        if booking.is_empty() {
            return Ok(());
        }
        self.fund(tx, &mut booking, plans, now, rules).await?;
        let orgs: Vec<String> = booking
            .sessions
            .values()
            .map(|s| s.org_id.clone())
            .collect();
        let shard_of = self.shard_of(tx, orgs.iter().map(String::as_str)).await?;
        if sorted_unique(shard_of.values()).len() == 1 {
            return self.write_booking(tx, shard, &booking).await;
        }
        for part in booking
            .split_by(|org| shard_of.get(org).copied().unwrap_or(0))
            .values()
        {
            self.write_booking(tx, shard, part).await?;
        }
        Ok(())
    }
}

/// Up to `limit` sessions of `orgs` (one shard's) that time alone changes: silent past two
/// leases, or idle for a week; rows another instance holds are skipped.
/// What the expiry job looks for, as of its `now`.
struct Due {
    /// Running sessions last heard before this are silent.
    silent_since: Secs,
    /// Idle sessions whose span began by this expire.
    idle_since: Secs,
    /// Held heartbeats received by this have waited long enough.
    held_before: Secs,
}

async fn select_expiring(
    tx: &mut Tx,
    orgs: &[&str],
    due: &Due,
    limit: i64,
) -> StoreResult<Vec<Session>> {
    let mut rows = Vec::new();
    for (condition, since) in [
        ("phase = 'running' AND last_at < ", due.silent_since),
        (
            "phase IN ('parked', 'admitted', 'silent') AND span_start <= ",
            due.idle_since,
        ),
        ("held_at IS NOT NULL AND held_at <= ", due.held_before),
    ] {
        rows.extend(unwrap_all(
            D::lock_sessions_where(tx, orgs, condition, since, limit).await?,
        ));
    }
    Ok(rows)
}

/// An org's running sessions (`$1`). Read on a generic plan on one PostgreSQL (`Pg::keyed`),
/// as is the usage page's count of parked ones (`funding_select_with`): tests/generic_plans.rs
/// checks both on a large org.
pub(crate) const RUNNING_SESSIONS: &str =
    "SELECT * FROM sessions WHERE org_id = $1 AND phase = 'running'";

#[async_trait]
impl LedgerStore for D {
    async fn ingest(
        &self,
        requests: &[Vec<Heartbeat>],
        rules: &Rules,
        plans: &Plans,
        now: Secs,
        shard: i64,
    ) -> StoreResult<Vec<RequestOutcome>> {
        if self.commits_by_shard() {
            let orgs = sorted_unique(requests.iter().flatten().map(|h| h.org_id.as_str()));
            let shard_of = self.shards_now(&orgs).await?;
            if sorted_unique(shard_of.values()).len() > 1 {
                let ask = (rules, plans, now, shard);
                return ingest_by_shard(self, requests, &orgs, &shard_of, ask).await;
            }
        }
        ingest_retried(self, requests, rules, plans, now, shard).await
    }

    async fn end_session(
        &self,
        org_id: &str,
        session_id: &str,
        status: EndStatus,
        now: Secs,
        rules: &Rules,
        plans: &Plans,
    ) -> StoreResult<Option<Session>> {
        let mut tx = begin_write(self.write()).await?;
        let locked = self.lock_sessions(&mut tx, &[(org_id, session_id)]).await?;
        let Some(mut s) = locked.into_values().next() else {
            return Ok(None);
        };
        let step = rush_meter_core::ledger::close_session(&s.ledger, now, status, rules);
        if !step.duplicate {
            s.ledger = step.ledger;
            let mut booking = Booking::default();
            for fx in &step.effects {
                booking.add(&s, fx);
            }
            self.fund_and_book(&mut tx, 0, booking, plans, now, rules)
                .await?;
            tx.commit().await?;
        }
        Ok(Some(s))
    }

    /// Each instance takes rows the others have not locked, one shard's orgs at a time.
    async fn expire_sessions(
        &self,
        now: Secs,
        rules: &Rules,
        plans: &Plans,
        limit: i64,
    ) -> StoreResult<usize> {
        let silent_since = rush_meter_core::ledger::silent_before(now, rules);
        let idle_since = now - rush_meter_core::ledger::PARKED_EXPIRY_SECS;
        let held_before = rush_meter_core::ledger::held_due_before(now, rules);
        let mut tx = begin_write(self.write()).await?;
        // Which orgs have sessions to expire: read first, so the locks name their orgs.
        let orgs: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT org_id FROM sessions WHERE \
               (phase = 'running' AND last_at < $1) OR \
               (phase IN ('parked', 'admitted', 'silent') AND span_start <= $2) OR \
               (held_at IS NOT NULL AND held_at <= $4) \
             LIMIT $3",
        )
        .bind(silent_since)
        .bind(idle_since)
        .bind(limit)
        .bind(held_before)
        .fetch_all(&mut *tx)
        .await?;
        let due = Due {
            silent_since,
            idle_since,
            held_before,
        };
        let mut rows: BTreeMap<SessionKey, Session> = BTreeMap::new();
        for orgs in self
            .by_shard(&mut tx, orgs.iter().map(String::as_str))
            .await?
            .values()
        {
            for s in select_expiring(&mut tx, orgs, &due, limit).await? {
                rows.insert(s.key(), s);
            }
        }
        let mut booking = Booking::default();
        for mut s in rows.into_values() {
            if let Some(step) = rush_meter_core::ledger::pass_time(&s.ledger, now, rules) {
                s.ledger = step.ledger;
                for fx in &step.effects {
                    booking.add(&s, fx);
                }
                if step.effects.is_empty() {
                    booking.add(&s, &rush_meter_core::ledger::Effects::default());
                }
            }
        }
        let changed = booking.sessions.len();
        self.fund_and_book(&mut tx, 0, booking, plans, now, rules)
            .await?;
        tx.commit().await?;
        Ok(changed)
    }

    async fn get_session(&self, org_id: &str, session_id: &str) -> StoreResult<Option<Session>> {
        Ok(sqlx::query_as::<_, Rec<Session>>(
            "SELECT * FROM sessions WHERE org_id = $1 AND session_id = $2",
        )
        .bind(org_id)
        .bind(session_id)
        .fetch_optional(self.read())
        .await?
        .map(|r| r.0))
    }

    async fn orgs_with_session(&self, session_id: &str, limit: i64) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT org_id FROM sessions WHERE session_id = $1 ORDER BY org_id LIMIT $2",
        )
        .bind(session_id)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }

    async fn sessions_of_org(&self, org_id: &str) -> StoreResult<Vec<Session>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Session>>(
                "SELECT * FROM sessions WHERE org_id = $1 ORDER BY session_id",
            )
            .bind(org_id)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn running_sessions(&self, org_id: &str) -> StoreResult<Vec<Session>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Session>>(RUNNING_SESSIONS)
                .bind(org_id)
                .fetch_all(self.keyed())
                .await?,
        ))
    }

    async fn list_sessions(
        &self,
        org_id: &str,
        phase: Option<Phase>,
        from: Secs,
        to: Secs,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<Session>> {
        let (after_at, after_id) = after.unwrap_or((i64::MIN, String::new()));
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Session>>(
                "SELECT * FROM sessions WHERE org_id = $1 AND ($2 IS NULL OR phase = $2) \
                   AND created_at >= $3 AND created_at < $4 \
                   AND (created_at > $5 OR (created_at = $5 AND session_id > $6)) \
                 ORDER BY created_at, session_id LIMIT $7",
            )
            .bind(org_id)
            .bind(phase.map(Phase::as_str))
            .bind(from)
            .bind(to)
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn window_usage(
        &self,
        org_ids: &[&str],
        windows: &Windows,
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<HashMap<String, WindowTotals>> {
        let mut reads: Vec<BoxFuture<'_, _>> = Vec::new();
        for orgs in self.parts_by_shard(org_ids).await? {
            reads.push(Box::pin(async move {
                let mut conn = self.keyed().acquire().await?;
                window_usage_on(&mut conn, &orgs, windows, now, rules).await
            }));
        }
        Ok(shards_at_once(reads).await?.into_iter().flatten().collect())
    }

    async fn running_spans(&self, org_id: &str) -> StoreResult<Vec<(String, Secs, Secs)>> {
        Ok(sqlx::query_as(
            "SELECT session_id, start_at, end_at FROM spans WHERE org_id = $1 AND kind = 'running' \
             UNION ALL \
             SELECT session_id, span_start, last_at FROM sessions \
             WHERE org_id = $1 AND phase = 'running' AND last_at > span_start \
             ORDER BY 1, 2",
        )
        .bind(org_id)
        .fetch_all(self.read())
        .await?)
    }

    async fn session_spans(
        &self,
        org_id: &str,
        session_id: &str,
    ) -> StoreResult<Vec<(Secs, Secs, String)>> {
        Ok(sqlx::query_as(
            "SELECT start_at, end_at, kind FROM spans WHERE org_id = $1 AND session_id = $2 \
             ORDER BY start_at",
        )
        .bind(org_id)
        .bind(session_id)
        .fetch_all(self.read())
        .await?)
    }

    async fn hourly_totals(&self, org_id: &str) -> StoreResult<Vec<(Secs, i64)>> {
        Ok(sqlx::query_as(
            "SELECT hour, CAST(SUM(seconds) AS BIGINT) FROM org_hourly WHERE org_id = $1 \
             GROUP BY hour ORDER BY hour",
        )
        .bind(org_id)
        .fetch_all(self.read())
        .await?)
    }

    async fn session_hourly_totals(&self, org_id: &str) -> StoreResult<Vec<(String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT session_id, CAST(SUM(seconds) AS BIGINT) FROM session_hourly \
             WHERE org_id = $1 GROUP BY session_id ORDER BY session_id",
        )
        .bind(org_id)
        .fetch_all(self.read())
        .await?)
    }

    /// Each piece carries the grouping key (an hour, a day's start, a session, or the
    /// session's project, user or agent) and dummies for the rest, so `breakdown::group`
    /// merges them with running sessions' pieces as they are.
    async fn session_hour_pieces(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        by: GroupBy,
    ) -> StoreResult<Vec<Piece>> {
        // Each grouping is read as (its key, seconds) pairs, the rest of a piece filled in
        // here: a month by hour is 720 rows and by session thousands, and SQLite hands a
        // row's every column over one by one (constant columns made the hour breakdown 3x
        // its raw read there). By time, the org's own hourly rollup (written in the same
        // transaction, so equal) has a row an hour, not a row a session-hour; by session,
        // the per-session rollup; by project, user or agent, the member rollup (buckets of
        // the hours `[from, to)`).
        let (table, key, column) = match by {
            GroupBy::Hour | GroupBy::Funding => ("org_hourly", "hour", "hour"),
            GroupBy::Day => ("org_hourly", "(hour / 86400) * 86400", "hour"),
            GroupBy::Session => ("session_hourly", "session_id", "hour"),
            GroupBy::Project => ("member_hourly", "member_id", "bucket"),
            GroupBy::User => ("member_hourly", "member_id", "bucket"),
            GroupBy::Agent => ("member_hourly", "member_id", "bucket"),
        };
        let dimension = match by {
            GroupBy::Project => " AND dimension = 'project'",
            GroupBy::User => " AND dimension = 'user'",
            GroupBy::Agent => " AND dimension = 'agent'",
            _ => "",
        };
        let sql = format!(
            "SELECT {key} AS k, CAST(SUM(seconds) AS BIGINT) AS s FROM {table} \
             WHERE org_id = $1{dimension} AND {column} >= $2 AND {column} < $3 GROUP BY {key}"
        );
        let piece = |hour: Secs, seconds: i64| Piece {
            hour,
            session_id: String::new(),
            project_id: None,
            started_by: None,
            agent: None,
            seconds,
        };
        if matches!(by, GroupBy::Hour | GroupBy::Funding | GroupBy::Day) {
            let rows = self
                .key_seconds::<Secs>(&sql, org_id, from, to, false)
                .await?;
            return Ok(rows.into_iter().map(|(h, s)| piece(h, s)).collect());
        }
        let by_session = by == GroupBy::Session;
        let rows = self
            .key_seconds::<String>(&sql, org_id, from, to, by_session)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, seconds)| {
                // A member rollup's '' is "none" (no project, no user).
                let named = Some(name.clone()).filter(|n| !n.is_empty());
                let mut p = piece(0, seconds);
                match by {
                    GroupBy::Session => p.session_id = name,
                    GroupBy::Project => p.project_id = named,
                    GroupBy::User => p.started_by = named,
                    _ => p.agent = named,
                }
                p
            })
            .collect())
    }
}
