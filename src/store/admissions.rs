// The gate's SQL, written once for both backends: `include!`d by `store::pg` and
// `store::sqlite` after `queries.rs`. Deciding is pure (`gate::decide_group`); this reads
// the facts under the right locks and writes what was decided.

/// Decide a group of admissions in one transaction that holds the row lock of every key
/// the group names (PostgreSQL, taken in byte order) or the database's write lock
/// (SQLite), so that no number of callers on any number of instances gets past a key's
/// limit. Every decision is recorded in the same transaction. Retries the group when a
/// session it would create appeared meanwhile, and on a serialization failure or deadlock.
pub async fn admit(
    pool: &Pool<DB>,
    plans: &crate::plans::Plans,
    requests: &[AdmissionRequest],
    now: Secs,
    rules: &Rules,
) -> StoreResult<Vec<Result<DecisionRow, AdmitReject>>> {
    retry_group("sessions kept appearing during admission", || {
        admit_once(pool, plans, requests, now, rules)
    })
    .await
}

async fn admit_once(
    pool: &Pool<DB>,
    plans: &crate::plans::Plans,
    requests: &[AdmissionRequest],
    now: Secs,
    rules: &Rules,
) -> StoreResult<Option<Vec<Result<DecisionRow, AdmitReject>>>> {
    let mut tx = begin_write(pool).await?;
    let mut facts = crate::gate::GroupFacts::default();

    let keys = sorted_unique(requests.iter().map(|r| (r.org_id.as_str(), r.key_id.as_str())));
    for chunk in keys.chunks(CHUNK) {
        for k in lock_keys(&mut tx, chunk).await? {
            facts.keys.insert((k.org_id.clone(), k.key_id.clone()), k);
        }
    }
    let org_ids = sorted_unique(requests.iter().map(|r| r.org_id.as_str()));
    for chunk in org_ids.chunks(CHUNK) {
        for o in select_orgs(&mut *tx, chunk).await? {
            facts.orgs.insert(o.org_id.clone(), o);
        }
    }
    let session_ids = sorted_unique(requests.iter().map(|r| r.session_id.as_str()));
    for s in lock_sessions(&mut tx, &session_ids).await? {
        facts.sessions.insert(s.session_id.clone(), s);
    }
    for chunk in keys.chunks(CHUNK) {
        for (org, key, n) in slot_counts(&mut tx, chunk, now - rules.lease).await? {
            facts.slots.insert((org, key), n);
        }
    }
    // Orgs on a Stripe period have their own month window; the rest share the calendar's.
    let mut by_window: BTreeMap<(Secs, Secs), (crate::quota::Windows, Vec<&str>)> = BTreeMap::new();
    for org in facts.orgs.values() {
        let w = crate::quota::Windows::at(now, org.billing_period());
        by_window
            .entry((w.month.start, w.month.end))
            .or_insert_with(|| (w, Vec::new()))
            .1
            .push(org.org_id.as_str());
    }
    let mut usage = HashMap::new();
    for (windows, ids) in by_window.values() {
        usage.extend(window_usage_on(&mut tx, ids, windows, now, rules).await?);
    }
    facts.usage = usage;

    let outcome = crate::gate::decide_group(plans, requests, facts, now, rules.lease, || {
        format!("dec_{:016x}", rand::random::<u64>())
    });
    let decisions: Vec<&DecisionRow> = outcome.answers.iter().flatten().collect();
    let (created, resumed) = (&outcome.created, &outcome.resumed);
    assert!(created.len() + resumed.len() <= CHUNK && decisions.len() <= CHUNK, "group too big");
    if !write_admissions(&mut tx, created, resumed, &decisions).await? {
        // A heartbeat created one of the new sessions meanwhile (there was no row to lock):
        // start over and see it.
        return Ok(None);
    }
    tx.commit().await?;
    Ok(Some(outcome.answers))
}

/// The distinct items, in byte order: the order every writer takes its locks in.
fn sorted_unique<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = items.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The SQL twin of `gate::holds_slot`, with the lease's start as `$1`.
const SLOT_HELD: &str = "phase <> 'ended' AND ( \
       (phase = 'running' AND COALESCE(heard_at, last_at) >= $1) OR \
       (slot_at >= $1 AND (phase = 'admitted' OR heard_at IS NULL OR heard_at <= slot_at)))";

/// An org's decisions in `[from, to)`, oldest first, after the `(decided_at, decision_id)`
/// cursor, at most `limit`; `only` keeps `allow` or `deny`.
pub async fn list_decisions(
    pool: &Pool<DB>,
    org_id: &str,
    from: Secs,
    to: Secs,
    only: Option<&str>,
    after: Option<(Secs, String)>,
    limit: i64,
) -> StoreResult<Vec<DecisionRow>> {
    let (after_at, after_id) = after.unwrap_or((i64::MIN, String::new()));
    Ok(sqlx::query_as::<_, DecisionRow>(
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
    .fetch_all(pool)
    .await?)
}

const DECISION_COLUMNS: &str = "org_id, decision_id, decided_at, session_id, key_id, decision, \
     reason, rule, plan_id, suspended, month_start, month_end, month_used, month_limit, \
     week_start, week_end, week_used, week_limit, running, concurrency_limit, upgrade_plan";

/// Decisions of an org with `reason` since `since`.
pub async fn count_decisions(pool: &Pool<DB>, org_id: &str, reason: &str, since: Secs) -> StoreResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM decisions WHERE org_id = $1 AND decided_at >= $2 AND reason = $3",
    )
    .bind(org_id)
    .bind(since)
    .bind(reason)
    .fetch_one(pool)
    .await?)
}
