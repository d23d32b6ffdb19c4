//! The gate's SQL (`GateStore`), written once for both dialects. Deciding is pure
//! (`core::gate::decide_group`); this reads the facts under the right locks and writes what
//! was decided.

use super::*;

/// What a group reads of the orgs that share `windows` (at most `CHUNK`): their window
/// sums and, for those that set limits inside the org (`Org::sets_limits`; most set none,
/// and pay nothing for the feature), the limits on `members`.
pub(crate) struct GateReads<'a> {
    orgs: &'a [&'a Org],
    windows: &'a Windows,
    members: &'a [&'a str],
    now: Secs,
    rules: &'a Rules,
    /// The orgs' ids, and those of the orgs among them that set limits.
    ids: Vec<&'a str>,
    limited: Vec<&'a str>,
    /// The window sums' bound values, which the statement's text depends on too.
    sums: WindowSums,
}

/// The columns every row of the gate's reads comes in (`GateReads::sql`): a row's kind, its
/// org, the limit's kind and member (or a session id that exists, or a key), the limit's hours,
/// and five figures (a sums row's month, week, running, month and week provisional).
pub(crate) const GATE_READ_COLUMNS: [&str; 5] = [
    "created_at",
    "updated_at",
    "month_used",
    "week_used",
    "fifth",
];

impl<'a> GateReads<'a> {
    pub(crate) fn new(
        orgs: &'a [&'a Org],
        windows: &'a Windows,
        members: &'a [&'a str],
        now: Secs,
        rules: &'a Rules,
    ) -> GateReads<'a> {
        let limited = orgs.iter().filter(|o| o.sets_limits);
        GateReads {
            ids: orgs.iter().map(|o| o.org_id.as_str()).collect(),
            limited: limited.map(|o| o.org_id.as_str()).collect(),
            sums: WindowSums::new(windows),
            orgs,
            windows,
            members,
            now,
            rules,
        }
    }

    /// One statement for the sums and the limits (`window_sums_sql` and the limits' rows
    /// side by side, the sums' rows padded to the limits' columns), so that limits cost a
    /// group no round trip of their own; and the number of its first parameter after its
    /// own (`bind` binds them).
    pub(crate) fn sql(&self) -> (String, usize) {
        let orgs = self.orgs.len();
        let sums = format!(
            "SELECT 'sums' AS row_kind, org_id, CAST(NULL AS TEXT) AS kind, \
               CAST(NULL AS TEXT) AS member_id, CAST(NULL AS TEXT) AS monthly_hours, \
               CAST(NULL AS TEXT) AS weekly_hours, s1 AS created_at, s2 AS updated_at, \
               s3 AS month_used, s4 AS week_used, s5 AS fifth \
             FROM ({}) AS w",
            window_sums_sql(orgs, &self.sums.edges)
        );
        let first = WINDOW_SUMS_PARAMETERS + orgs;
        if self.limited.is_empty() {
            return (sums, first + 1);
        }
        let limits = limit_rows_sql(first + 1, Some(first + 2));
        let sql = format!("{sums} UNION ALL SELECT l.*, CAST(0 AS BIGINT) FROM ({limits}) AS l");
        (sql, first + 3)
    }

    /// Bind the statement's parameters (`sql`) to `q`.
    pub(crate) fn bind<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        let q = self.sums.bind(q, &self.ids, self.now, self.rules);
        if self.limited.is_empty() {
            return q;
        }
        q.bind(D::id_list(&self.limited))
            .bind(D::id_list(self.members))
    }

    /// The sums and limits the statement's `rows` carry (rows of other kinds beside them
    /// are left alone), and the use of the members whose limits are within reach.
    ///
    /// A member never used more than its org, so only limits within reach of their org's
    /// use (`Limit::within_reach`) can be spent, and only their members' use is read, by a
    /// second statement (`limits_with_usage_on`). Most limits are far from it: their use
    /// stays unread (zero in the result), which decides the same, since the gate records
    /// a limit's figures only when it refuses by it. The use read is most of what limits
    /// cost a group (reports/admission-notes.md).
    pub(crate) async fn finish(
        &self,
        tx: &mut Tx,
        rows: &[Row],
    ) -> StoreResult<(
        HashMap<String, WindowTotals>,
        HashMap<String, (Vec<Limit>, MemberUsage)>,
    )> {
        use sqlx::Row as _;
        let mut usage: HashMap<String, WindowTotals> = HashMap::new();
        let mut limits = LimitsRead::default();
        limits.absorb(rows)?;
        for row in rows {
            if row.try_get::<String, _>("row_kind")? == "sums" {
                add_window_sums(&mut usage, row, GATE_READ_COLUMNS)?;
            }
        }
        let mut limits = limits.finish();
        let mut near_orgs: Vec<&Org> = Vec::new();
        let mut near_members: Vec<&str> = Vec::new();
        for org in self.orgs {
            let used = usage.get(&org.org_id).copied().unwrap_or_default();
            let of_org = limits
                .get(&org.org_id)
                .map_or(&[][..], |(l, _)| l.as_slice());
            let near =
                rush_meter_core::members::members_within_reach(of_org, (used.month, used.week));
            if !near.is_empty() {
                near_orgs.push(org);
                near_members.extend(near);
            }
        }
        if !near_orgs.is_empty() {
            let near_members = sorted_unique(near_members.into_iter());
            let read =
                limits_with_usage_on(tx, &near_orgs, Some(&near_members), self.now, self.rules);
            for (org, (_, used)) in read.await? {
                if let Some((_, usage)) = limits.get_mut(&org) {
                    usage.extend(used);
                }
            }
        }
        Ok((usage, limits))
    }

    /// Read them in a statement of their own (`window_usage_on` when no org sets limits).
    pub(crate) async fn read(
        &self,
        tx: &mut Tx,
    ) -> StoreResult<(
        HashMap<String, WindowTotals>,
        HashMap<String, (Vec<Limit>, MemberUsage)>,
    )> {
        if self.limited.is_empty() {
            let usage = window_usage_on(tx, &self.ids, self.windows, self.now, self.rules);
            return Ok((usage.await?, HashMap::new()));
        }
        let (sql, _) = self.sql();
        let rows = self.bind(sqlx::query(&sql)).fetch_all(&mut **tx).await?;
        self.finish(tx, &rows).await
    }
}

pub(crate) const DECISION_COLUMNS: &str =
    "org_id, decision_id, decided_at, session_id, key_id, decision, \
     reason, rule, plan_id, suspended, month_start, month_end, month_used, month_limit, \
     week_start, week_end, week_used, week_limit, running, concurrency_limit, upgrade_plan, \
     funded_by, plan_room, grant_room, overage_room, limit_kind, limit_member, limit_month_used, \
     limit_month, limit_week_used, limit_week, plan_version";

/// The reads of a group's orgs, grouped by their windows (`standing::by_windows`), a chunk
/// at a time, for the limits of `members`.
fn gate_reads<'a>(
    by_windows: &'a BTreeMap<Windows, Vec<&'a Org>>,
    members: &'a [&'a str],
    now: Secs,
    rules: &'a Rules,
) -> Vec<GateReads<'a>> {
    by_windows
        .iter()
        .flat_map(|(windows, orgs)| {
            orgs.chunks(CHUNK)
                .map(|chunk| GateReads::new(chunk, windows, members, now, rules))
        })
        .collect()
}

/// What a backend may read early, in the find phase's first statement
/// (`GateRows::early_reads`; SQLite's copy reads nothing early, and none of it).
#[derive(Clone, Copy)]
#[allow(dead_code)]
pub struct EarlyAsk<'a> {
    /// `(org, session)` as the group names them.
    pub(crate) sessions: &'a [(&'a str, &'a str)],
    pub(crate) shards: &'a BTreeMap<i64, Vec<&'a str>>,
    pub(crate) keys: &'a [(&'a str, &'a str)],
    /// The start of the lease: sessions heard since hold their slots.
    pub(crate) since: Secs,
    /// The group's first reads of window sums and limits.
    pub(crate) reads: Option<&'a GateReads<'a>>,
}

/// Read in one statement after the key locks (one PostgreSQL): which named sessions exist,
/// the keys' slot counts, and the rows of the group's first `GateReads`.
pub struct EarlyReads {
    pub(crate) existing: HashSet<SessionKey>,
    pub(crate) slots: Vec<SlotCount>,
    pub(crate) rows: Vec<Row>,
}

/// What an admission group names, in the order every writer locks in.
struct Named<'a> {
    requests: &'a [AdmissionRequest],
    /// `(org, key)`, sorted.
    keys: Vec<(&'a str, &'a str)>,
    /// The orgs, sorted.
    orgs: Vec<&'a str>,
    /// `(org, session)` as the requests name them.
    sessions: Vec<(&'a str, &'a str)>,
    /// The members whose limits the group reads: only those it names, since an org may
    /// limit many more and an admission never changes a member's use (bookings do).
    members: Vec<&'a str>,
}

impl<'a> Named<'a> {
    fn of(requests: &'a [AdmissionRequest]) -> Named<'a> {
        Named {
            requests,
            keys: sorted_unique(
                requests
                    .iter()
                    .map(|r| (r.org_id.as_str(), r.key_id.as_str())),
            ),
            orgs: sorted_unique(requests.iter().map(|r| r.org_id.as_str())),
            sessions: requests
                .iter()
                .map(|r| (r.org_id.as_str(), r.session_id.as_str()))
                .collect(),
            members: sorted_unique(requests.iter().flat_map(|r| RunMembers::of(r, None).all())),
        }
    }

    /// The keys of `orgs` (one shard's).
    fn keys_of(&self, orgs: &[&str]) -> Vec<(&'a str, &'a str)> {
        self.keys
            .iter()
            .filter(|(o, _)| orgs.binary_search(o).is_ok())
            .copied()
            .collect()
    }
}

/// What the lock phase read under the keys' locks.
struct Locked {
    keys: HashMap<(String, String), Key>,
    orgs: HashMap<String, Org>,
    funding: HashMap<String, rush_meter_core::funding::Recorded>,
}

/// Phase one, lock: every key the group names, shard after shard (the order every writer
/// locks in), then its orgs and their funding. Those are read in statements of their own,
/// after every key lock is held: a statement that waited for a lock reads from the
/// snapshot it began with, and would miss a suspension, a plan change or a booking
/// committed while it waited.
async fn lock_phase(
    tx: &mut Tx,
    named: &Named<'_>,
    shards: &BTreeMap<i64, Vec<&str>>,
    (now, spread): (Secs, bool),
) -> StoreResult<Locked> {
    let mut locked = Locked {
        keys: HashMap::with_capacity(named.keys.len()),
        orgs: HashMap::with_capacity(named.orgs.len()),
        funding: HashMap::with_capacity(named.orgs.len()),
    };
    for orgs in shards.values() {
        for chunk in named.keys_of(orgs).chunks(CHUNK) {
            for k in D::lock_keys(tx, orgs, chunk).await? {
                locked.keys.insert((k.org_id.clone(), k.key_id.clone()), k);
            }
        }
    }
    for chunk in shards.values().flat_map(|orgs| orgs.chunks(CHUNK)) {
        for FundingRow { org, recorded } in select_funding(&mut **tx, chunk, now, spread).await? {
            locked.funding.insert(org.org_id.clone(), recorded);
            locked.orgs.insert(org.org_id.clone(), org);
        }
    }
    Ok(locked)
}

/// What the find phase found.
struct Found {
    /// The named sessions that exist, locked, by org and id.
    sessions: HashMap<SessionKey, Session>,
    early: Option<EarlyReads>,
}

/// Phase two, find: which sessions the group names exist, and those locked. For new
/// sessions, the common case, nothing is locked: a backend that reads early
/// (`GateRows::early_reads`) learns there is none in the statement that counts the keys'
/// slots; others look for them under their lock. A session created by another writer
/// after this is found at the write, which then starts the try over.
async fn find_phase(
    store: &D,
    tx: &mut Tx,
    named: &Named<'_>,
    ask: EarlyAsk<'_>,
) -> StoreResult<Found> {
    let early = store.early_reads(tx, &ask).await?;
    let to_lock: Vec<(&str, &str)> = match &early {
        Some(e) => named
            .sessions
            .iter()
            .copied()
            .filter(|(o, s)| e.existing.contains(&session_key(o, s)))
            .collect(),
        None => named.sessions.clone(),
    };
    let sessions = if to_lock.is_empty() {
        HashMap::new()
    } else {
        store.lock_sessions(tx, &to_lock).await?
    };
    Ok(Found { sessions, early })
}

/// What the read phase read: slots, window sums, limits and the use of limited members.
#[derive(Default)]
struct Read {
    slots: HashMap<(String, String), i64>,
    usage: HashMap<String, WindowTotals>,
    limits: HashMap<String, Vec<Limit>>,
    member_usage: HashMap<String, MemberUsage>,
}

/// Phase three, read: the keys' slots and the orgs' window sums and limits, using what
/// was read early while it still holds. Slot counts made before the group's existing
/// sessions were locked are made again (a heartbeat committed meanwhile may have
/// moved one of them in or out of its slot); a resume that leaves out its project or user
/// runs as its session's (`RunMembers`), whose limits are then read too, in statements of
/// their own.
async fn read_phase(
    tx: &mut Tx,
    named: &Named<'_>,
    shards: &BTreeMap<i64, Vec<&str>>,
    by_windows: &BTreeMap<Windows, Vec<&Org>>,
    first: Vec<GateReads<'_>>,
    found: &mut Found,
    ask: (Secs, &Rules),
) -> StoreResult<Read> {
    let (now, rules) = ask;
    let since = now - rules.lease;
    let (early_slots, early_rows) = match found.early.take() {
        Some(EarlyReads { slots, rows, .. }) => (Some(slots), Some(rows)),
        None => (None, None),
    };
    let mut read = Read::default();
    let slots = match early_slots {
        Some(slots) if found.sessions.is_empty() => slots,
        _ => count_slots(tx, named, shards, since).await?,
    };
    for (org, key, n) in slots {
        read.slots.insert((org, key), n);
    }
    let also: Vec<&str> = named
        .requests
        .iter()
        .flat_map(|r| {
            RunMembers::of(
                r,
                found.sessions.get(&session_key(&r.org_id, &r.session_id)),
            )
            .all()
        })
        .filter(|m| named.members.binary_search(m).is_err())
        .collect();
    let wider: Vec<&str>;
    let (reads, early_rows) = if also.is_empty() {
        (first, early_rows)
    } else {
        wider = sorted_unique(named.members.iter().copied().chain(also));
        (gate_reads(by_windows, &wider, now, rules), None)
    };
    for (i, reads) in reads.iter().enumerate() {
        let (usage, limits) = match (i, &early_rows) {
            (0, Some(rows)) => reads.finish(tx, rows).await?,
            _ => reads.read(tx).await?,
        };
        read.usage.extend(usage);
        for (org, (limits, used)) in limits {
            read.limits.insert(org.clone(), limits);
            read.member_usage.insert(org, used);
        }
    }
    Ok(read)
}

/// The slots each of the group's keys holds, a shard at a time.
async fn count_slots(
    tx: &mut Tx,
    named: &Named<'_>,
    shards: &BTreeMap<i64, Vec<&str>>,
    since: Secs,
) -> StoreResult<Vec<SlotCount>> {
    let mut counts = Vec::with_capacity(named.keys.len());
    for orgs in shards.values() {
        for chunk in named.keys_of(orgs).chunks(CHUNK) {
            counts.extend(D::slot_counts(tx, orgs, chunk, since).await?);
        }
    }
    Ok(counts)
}

/// Phase four, decide: the core's rules over what was read (`core::gate::decide_group`).
fn decide_phase(
    plans: &Plans,
    requests: &[AdmissionRequest],
    locked: Locked,
    found: Found,
    read: Read,
    ask: (Secs, &Rules),
) -> GroupOutcome {
    let facts = GroupFacts {
        orgs: locked.orgs,
        keys: locked.keys,
        sessions: found.sessions,
        slots: read.slots,
        usage: read.usage,
        funding: locked.funding,
        limits: read.limits,
        member_usage: read.member_usage,
    };
    rush_meter_core::gate::decide_group(plans, requests, facts, ask.0, ask.1.lease, || {
        crate::ids::mint(crate::ids::Kind::Decision)
    })
}

/// Phase five, write: the sessions and decisions, a shard at a time. False when a
/// session it would create was made by another writer meanwhile.
async fn write_phase(
    store: &D,
    tx: &mut Tx,
    shards: &BTreeMap<i64, Vec<&str>>,
    outcome: &GroupOutcome,
) -> StoreResult<bool> {
    let decisions: Vec<&Decision> = outcome.answers.iter().flatten().collect();
    let (created, resumed) = (&outcome.created, &outcome.resumed);
    assert!(
        created.len() + resumed.len() <= CHUNK && decisions.len() <= CHUNK,
        "group too big"
    );
    for orgs in shards.values() {
        let written = if shards.len() == 1 {
            store
                .write_admissions(tx, orgs, created, resumed, &decisions)
                .await?
        } else {
            let mine = |org: &str| orgs.binary_search(&org).is_ok();
            let pick = |rows: &[Session]| -> Vec<Session> {
                rows.iter().filter(|s| mine(&s.org_id)).cloned().collect()
            };
            let ds: Vec<&Decision> = decisions
                .iter()
                .copied()
                .filter(|d| mine(&d.org_id))
                .collect();
            store
                .write_admissions(tx, orgs, &pick(created), &pick(resumed), &ds)
                .await?
        };
        if !written {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One try of an admission group, in one transaction that holds the row lock of every key
/// the group names (PostgreSQL, taken in byte order) or the database's write lock
/// (SQLite), so that no number of callers on any number of instances gets past a key's
/// limit. Every decision is recorded in the same transaction. `None` when a session it
/// would create appeared meanwhile (start over and see it).
async fn admit_once(
    store: &D,
    plans: &Plans,
    requests: &[AdmissionRequest],
    now: Secs,
    rules: &Rules,
    written: &std::sync::Mutex<Option<Written>>,
) -> StoreResult<Option<Vec<Result<Decision, AdmitReject>>>> {
    let mut tx = store.begin_hot().await?;
    let named = Named::of(requests);
    let shards = store.by_shard(&mut tx, named.orgs.iter().copied()).await?;
    let locked = lock_phase(&mut tx, &named, &shards, (now, store.spread())).await?;
    let by_windows = rush_meter_core::standing::by_windows(locked.orgs.values(), now);
    let first = gate_reads(&by_windows, &named.members, now, rules);
    let ask = EarlyAsk {
        sessions: &named.sessions,
        shards: &shards,
        keys: &named.keys,
        since: now - rules.lease,
        reads: first.first(),
    };
    let mut found = find_phase(store, &mut tx, &named, ask).await?;
    let read = read_phase(
        &mut tx,
        &named,
        &shards,
        &by_windows,
        first,
        &mut found,
        (now, rules),
    )
    .await?;
    drop(by_windows);
    let outcome = decide_phase(plans, requests, locked, found, read, (now, rules));
    if !write_phase(store, &mut tx, &shards, &outcome).await? {
        return Ok(None);
    }
    if let Some(told) = written.lock().expect("written").take() {
        let _ = told.send(());
    }
    tx.commit().await?;
    Ok(Some(outcome.answers))
}

/// An admission group in one transaction, tried again as `retry_group` says.
async fn admit_retried(
    store: &D,
    plans: &Plans,
    requests: &[AdmissionRequest],
    (now, rules): (Secs, &Rules),
    written: Option<Written>,
) -> StoreResult<Vec<Result<Decision, AdmitReject>>> {
    // An attempt that tells `written` goes on to its COMMIT; one that starts over has not
    // told it yet.
    let written = &std::sync::Mutex::new(written);
    retry_group("sessions kept appearing during admission", || {
        admit_once(store, plans, requests, now, rules, written)
    })
    .await
}

/// A group whose orgs lie on several shards, where the store commits a shard at a time
/// (`Dialect::commits_by_shard`): each shard's admissions in a transaction of their own
/// (no two-phase commit), `SHARDS_AT_ONCE` at once. A part that fails fails the group
/// after others may have committed, as a commit whose answer was lost does: a caller that
/// asks again is answered for the session it now has. The group's writer is not told
/// early (`written`), and takes the next group once every part is done.
async fn admit_by_shard(
    store: &D,
    plans: &Plans,
    requests: &[AdmissionRequest],
    shard_of: &HashMap<&str, i64>,
    ask: (Secs, &Rules),
) -> StoreResult<Vec<Result<Decision, AdmitReject>>> {
    let mut parts: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        parts
            .entry(shard_of[r.org_id.as_str()])
            .or_default()
            .push(i);
    }
    type Answered = (Vec<usize>, Vec<Result<Decision, AdmitReject>>);
    let work: Vec<BoxFuture<'_, StoreResult<Answered>>> = parts
        .into_values()
        .map(|at| {
            Box::pin(async move {
                let part: Vec<AdmissionRequest> = at.iter().map(|&i| requests[i].clone()).collect();
                let answers = admit_retried(store, plans, &part, ask, None).await?;
                Ok((at, answers))
            }) as BoxFuture<'_, _>
        })
        .collect();
    let mut out: Vec<Option<Result<Decision, AdmitReject>>> = vec![None; requests.len()];
    for (at, answers) in shards_at_once(work).await? {
        for (i, answer) in at.into_iter().zip(answers) {
            out[i] = Some(answer);
        }
    }
    Ok(out
        .into_iter()
        .map(|a| a.expect("every admission is in one shard's part"))
        .collect())
}

#[async_trait]
impl GateStore for D {
    async fn admit_telling(
        &self,
        plans: &Plans,
        requests: &[AdmissionRequest],
        now: Secs,
        rules: &Rules,
        written: Option<Written>,
    ) -> StoreResult<Vec<Result<Decision, AdmitReject>>> {
        if self.commits_by_shard() {
            let orgs = sorted_unique(requests.iter().map(|r| r.org_id.as_str()));
            let shard_of = self.shards_now(&orgs).await?;
            if sorted_unique(shard_of.values()).len() > 1 {
                return admit_by_shard(self, plans, requests, &shard_of, (now, rules)).await;
            }
        }
        admit_retried(self, plans, requests, (now, rules), written).await
    }

    async fn list_decisions(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        only: Option<&str>,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<Decision>> {
        let (after_at, after_id) = after.unwrap_or((i64::MIN, String::new()));
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Decision>>(
                "SELECT * FROM decisions WHERE org_id = $1 AND decided_at >= $2 AND decided_at < $3 \
                   AND ($4 IS NULL OR decision = $4) \
                   AND (decided_at > $5 OR (decided_at = $5 AND decision_id > $6)) \
                 ORDER BY decided_at, decision_id LIMIT $7",
            )
            .bind(org_id)
            .bind(from)
            .bind(to)
            .bind(only)
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn count_decisions(&self, org_id: &str, reason: &str, since: Secs) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM decisions WHERE org_id = $1 AND decided_at >= $2 AND reason = $3",
        )
        .bind(org_id)
        .bind(since)
        .bind(reason)
        .fetch_one(self.read())
        .await?)
    }
}
