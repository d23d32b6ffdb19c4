// The gate's SQL (`GateStore`), written once for both dialects. Deciding is pure
// (`core::gate::decide_group`); this reads the facts under the right locks and writes what
// was decided.

/// What a group reads of the orgs that share `windows` (at most `CHUNK`): their window
/// sums and, for those that set limits inside the org (`Org::sets_limits`; most set none,
/// and pay nothing for the feature), the limits on `members`.
struct GateReads<'a> {
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
/// org, the limit's kind and member (or a claimed session id, or a key), the limit's hours,
/// and five figures (a sums row's month, week, running, month and week provisional).
const GATE_READ_COLUMNS: [&str; 5] = ["created_at", "updated_at", "month_used", "week_used", "fifth"];

impl<'a> GateReads<'a> {
    fn new(
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
    fn sql(&self) -> (String, usize) {
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
    fn bind<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        let q = self.sums.bind(q, &self.ids, self.now, self.rules);
        if self.limited.is_empty() {
            return q;
        }
        q.bind(org_list(&self.limited)).bind(org_list(self.members))
    }

    /// The sums and limits the statement's `rows` carry (rows of other kinds beside them
    /// are left alone), and the use of the members whose limits are within reach.
    ///
    /// A member never used more than its org, so only limits within reach of their org's
    /// use (`Limit::within_reach`) can be spent, and only their members' use is read, by a
    /// second statement (`limits_with_usage_on`). Most limits are far from it: their use
    /// stays unread (zero in the result), which decides the same, since the gate records
    /// a limit's figures only when it refuses by it. On SQLite the use read was most of
    /// the limits' cost: 0.29 of the 0.35 ms a group's statement took, for an org of 200
    /// running sessions.
    async fn finish(
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
            let of_org = limits.get(&org.org_id).map_or(&[][..], |(l, _)| l.as_slice());
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
    async fn read(
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

const DECISION_COLUMNS: &str = "org_id, decision_id, decided_at, session_id, key_id, decision, \
     reason, rule, plan_id, suspended, month_start, month_end, month_used, month_limit, \
     week_start, week_end, week_used, week_limit, running, concurrency_limit, upgrade_plan, \
     funded_by, plan_room, grant_room, overage_room, limit_kind, limit_member, limit_month_used, \
     limit_month, limit_week_used, limit_week";

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

/// One try of an admission group, in one transaction that holds the row lock of every key
/// the group names (PostgreSQL, taken in byte order) or the database's write lock
/// (SQLite), so that no number of callers on any number of instances gets past a key's
/// limit. Every decision is recorded in the same transaction. `None` when a session it
/// would create appeared meanwhile (start over and see it).
async fn admit_once(
    store: &Backend,
    plans: &Plans,
    requests: &[AdmissionRequest],
    now: Secs,
    rules: &Rules,
    written: &std::sync::Mutex<Option<Written>>,
) -> StoreResult<Option<Vec<Result<Decision, AdmitReject>>>> {
    let mut tx = store.begin_hot().await?;
    let mut facts = GroupFacts::default();
    let shards = store
        .by_shard(&mut tx, requests.iter().map(|r| r.org_id.as_str()))
        .await?;
    let keys = sorted_unique(requests.iter().map(|r| (r.org_id.as_str(), r.key_id.as_str())));
    let keys_of = |orgs: &[&str]| -> Vec<(&str, &str)> {
        keys.iter()
            .filter(|(o, _)| orgs.binary_search(o).is_ok())
            .copied()
            .collect()
    };
    // Keys first, shard after shard, then sessions: the order every writer locks in. The
    // orgs and their funding are read after every key lock is held, in statements of their
    // own: a statement that waited for a lock reads from the snapshot it began with, and
    // would miss a suspension, a plan change or a booking committed while it waited.
    let org_ids = sorted_unique(requests.iter().map(|r| r.org_id.as_str()));
    let mut locked = Vec::with_capacity(keys.len());
    for orgs in shards.values() {
        for chunk in keys_of(orgs).chunks(CHUNK) {
            locked.extend(lock_keys(&mut tx, orgs, chunk).await?);
        }
    }
    let mut funding = Vec::with_capacity(org_ids.len());
    for chunk in org_ids.chunks(CHUNK) {
        funding.extend(select_funding(&mut *tx, chunk, now).await?);
    }
    for k in locked {
        facts.keys.insert((k.org_id.clone(), k.key_id.clone()), k);
    }
    for FundingRow { org, recorded } in funding {
        facts.funding.insert(org.org_id.clone(), recorded);
        facts.orgs.insert(org.org_id.clone(), org);
    }
    let named: Vec<(&str, &str)> = requests
        .iter()
        .map(|r| (r.org_id.as_str(), r.session_id.as_str()))
        .collect();
    // Each id is claimed first for the first org that names it: for new sessions, the
    // common case, that is all (no session has an id before it is claimed, so there is
    // none to lock). Only the sessions of ids already claimed are locked, and only the
    // ids held by another org are looked up.
    let mut claims: BTreeMap<&str, &str> = BTreeMap::new();
    for (org, id) in &named {
        claims.entry(*id).or_insert(*org);
    }
    let wanted: Vec<(&str, &str)> = claims.iter().map(|(id, org)| (*org, *id)).collect();
    let since = now - rules.lease;
    // Only the members the group names: an org may limit many more than one group touches,
    // and an admission never changes a member's use (only bookings do).
    let members = sorted_unique(requests.iter().flat_map(|r| RunMembers::of(r, None).all()));
    let by_windows = rush_meter_core::standing::by_windows(facts.orgs.values(), now);
    let reads = gate_reads(&by_windows, &members, now, rules);
    // The slot counts, and the first reads of window sums and limits, may come with the
    // claim (two round trips fewer on one PostgreSQL): the counts are read after the keys
    // are locked, which is all a group of new sessions needs, and the sums need no lock.
    // A group naming sessions already known counts again below, after locking them (the
    // statement's counts are then unused: resumes are the rarer case).
    let (claimed, counted, read_rows) = store
        .claim_owners_counting_slots(&mut tx, &wanted, &shards, &keys, since, reads.first())
        .await?;
    let claimed: HashSet<String> = claimed.into_iter().collect();
    claims.retain(|id, _| claimed.contains(*id));
    let existing: Vec<(&str, &str)> = named
        .iter()
        .copied()
        .filter(|(_, id)| !claimed.contains(*id))
        .collect();
    if !existing.is_empty() {
        facts.sessions = store.lock_sessions(&mut tx, &existing).await?;
    }
    let held: Vec<&str> = sorted_unique(
        existing
            .iter()
            .map(|(_, id)| *id)
            .filter(|id| !facts.sessions.contains_key(*id)),
    );
    facts.owners = store.owners(&mut tx, &held).await?;
    if named
        .iter()
        .any(|(o, s)| facts.owners.get(*s).is_some_and(|owner| owner == o))
    {
        // One of its sessions was created after its lock was looked for: start over.
        return Ok(None);
    }
    // A resume that leaves out its project or user runs as the session's (`RunMembers`):
    // their limits are read too (all the group's limits again, in statements of their own).
    let also: Vec<&str> = requests
        .iter()
        .flat_map(|r| RunMembers::of(r, facts.sessions.get(&r.session_id)).all())
        .filter(|m| members.binary_search(m).is_err())
        .collect();
    let wider: Vec<&str>;
    let (reads, read_rows) = if also.is_empty() {
        (reads, read_rows)
    } else {
        wider = sorted_unique(members.iter().copied().chain(also));
        (gate_reads(&by_windows, &wider, now, rules), None)
    };
    // Counts read before the group's existing sessions were locked are read again: a
    // heartbeat committed meanwhile may have moved one of them in or out of its slot.
    let counted = match counted {
        Some(counts) if existing.is_empty() => counts,
        _ => {
            let mut counts = Vec::with_capacity(keys.len());
            for orgs in shards.values() {
                for chunk in keys_of(orgs).chunks(CHUNK) {
                    counts.extend(slot_counts(&mut tx, orgs, chunk, since).await?);
                }
            }
            counts
        }
    };
    for (org, key, n) in counted {
        facts.slots.insert((org, key), n);
    }
    for (i, reads) in reads.iter().enumerate() {
        let (usage, limits) = match (i, &read_rows) {
            (0, Some(rows)) => reads.finish(&mut tx, rows).await?,
            _ => reads.read(&mut tx).await?,
        };
        facts.usage.extend(usage);
        for (org, (limits, used)) in limits {
            facts.limits.insert(org.clone(), limits);
            facts.member_usage.insert(org, used);
        }
    }

    let outcome = rush_meter_core::gate::decide_group(plans, requests, facts, now, rules.lease, || {
        format!("dec_{:016x}", rand::random::<u64>())
    });
    let decisions: Vec<&Decision> = outcome.answers.iter().flatten().collect();
    let (created, resumed) = (&outcome.created, &outcome.resumed);
    assert!(
        created.len() + resumed.len() <= CHUNK && decisions.len() <= CHUNK,
        "group too big"
    );
    // Claims the decisions left unused are given back; a session created for another org
    // than the one its id was claimed for (two orgs naming one new id) is claimed anew.
    let created_by: HashMap<&str, &str> = created
        .iter()
        .map(|s| (s.session_id.as_str(), s.org_id.as_str()))
        .collect();
    let unused: Vec<&str> = claims
        .iter()
        .filter(|(id, org)| created_by.get(*id) != Some(*org))
        .map(|(id, _)| *id)
        .collect();
    if !unused.is_empty() {
        release_owners(&mut tx, &unused).await?;
    }
    let unclaimed: Vec<Session> = created
        .iter()
        .filter(|s| claims.get(s.session_id.as_str()) != Some(&s.org_id.as_str()))
        .cloned()
        .collect();
    if !unclaimed.is_empty() && !claim_all(&mut tx, &unclaimed).await? {
        // A session it would create was claimed by another writer meanwhile.
        return Ok(None);
    }
    for orgs in shards.values() {
        let written = if shards.len() == 1 {
            write_admissions(&mut tx, orgs, created, resumed, &decisions).await?
        } else {
            let mine = |org: &str| orgs.binary_search(&org).is_ok();
            let pick = |rows: &[Session]| -> Vec<Session> {
                rows.iter().filter(|s| mine(&s.org_id)).cloned().collect()
            };
            let ds: Vec<&Decision> = decisions.iter().copied().filter(|d| mine(&d.org_id)).collect();
            write_admissions(&mut tx, orgs, &pick(created), &pick(resumed), &ds).await?
        };
        if !written {
            return Ok(None);
        }
    }
    if let Some(told) = written.lock().expect("written").take() {
        let _ = told.send(());
    }
    tx.commit().await?;
    Ok(Some(outcome.answers))
}

#[async_trait]
impl GateStore for Backend {
    async fn admit_telling(
        &self,
        plans: &Plans,
        requests: &[AdmissionRequest],
        now: Secs,
        rules: &Rules,
        written: Option<Written>,
    ) -> StoreResult<Vec<Result<Decision, AdmitReject>>> {
        // An attempt that tells `written` goes on to its COMMIT; one that starts over has
        // not told it yet.
        let written = &std::sync::Mutex::new(written);
        retry_group("sessions kept appearing during admission", || {
            admit_once(self, plans, requests, now, rules, written)
        })
        .await
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
