// Stripe's tables, written once for both backends: `include!`d by `store::pg` and
// `store::sqlite` after `queries.rs`.

use super::{StripeEventRow, StripeRequestRow, SubscriptionState};

/// Store a webhook event as received; false if its id was stored before (a redelivery).
pub async fn insert_stripe_event(
    pool: &Pool<DB>,
    event_id: &str,
    kind: &str,
    created: Secs,
    payload: &str,
    now: Secs,
) -> StoreResult<bool> {
    let done = sqlx::query(
        "INSERT INTO stripe_events (event_id, type, created, payload, received_at, state, \
           attempts, next_attempt_at) VALUES ($1, $2, $3, $4, $5, 'pending', 0, $5) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(kind)
    .bind(created)
    .bind(payload)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Take up to `limit` pending events that are due, oldest first, and hold them for
/// `hold` seconds: an instance that dies while processing them leaves them to be taken
/// again after that. Each take counts as an attempt.
pub async fn claim_stripe_events(
    pool: &Pool<DB>,
    now: Secs,
    hold: Secs,
    limit: i64,
) -> StoreResult<Vec<StripeEventRow>> {
    let mut rows: Vec<StripeEventRow> = claim_due(
        pool,
        "stripe_events",
        "event_id",
        "next_attempt_at",
        "created, event_id",
        now,
        hold,
        limit,
    )
    .await?;
    rows.sort_by(|a, b| (a.created, &a.event_id).cmp(&(b.created, &b.event_id)));
    Ok(rows)
}

/// Record how processing an event went: `state` processed, ignored or quarantined, or
/// pending again with its next attempt at `next_attempt_at`.
pub async fn finish_stripe_event(
    pool: &Pool<DB>,
    event_id: &str,
    state: &str,
    org_id: Option<&str>,
    error: Option<&str>,
    next_attempt_at: Secs,
    now: Secs,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE stripe_events SET state = $2, org_id = COALESCE($3, org_id), last_error = $4, \
           next_attempt_at = $5, processed_at = CASE WHEN $2 = 'pending' THEN NULL ELSE $6 END \
         WHERE event_id = $1",
    )
    .bind(event_id)
    .bind(state)
    .bind(org_id)
    .bind(error)
    .bind(next_attempt_at)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

/// Events in `state` (all states when `None`), newest first, after the `received_at` /
/// `event_id` cursor.
pub async fn list_stripe_events(
    pool: &Pool<DB>,
    state: Option<&str>,
    before: Option<(Secs, String)>,
    limit: i64,
) -> StoreResult<Vec<StripeEventRow>> {
    let (at, id) = before.unwrap_or((i64::MAX, String::new()));
    Ok(sqlx::query_as::<_, StripeEventRow>(
        "SELECT * FROM stripe_events WHERE ($1 IS NULL OR state = $1) \
           AND (received_at < $2 OR (received_at = $2 AND event_id < $3)) \
         ORDER BY received_at DESC, event_id DESC LIMIT $4",
    )
    .bind(state)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Put a quarantined event back in the queue, due now; false if it is not quarantined.
pub async fn requeue_stripe_event(pool: &Pool<DB>, event_id: &str, now: Secs) -> StoreResult<bool> {
    let done = sqlx::query(
        "UPDATE stripe_events SET state = 'pending', attempts = 0, next_attempt_at = $2, \
           processed_at = NULL WHERE event_id = $1 AND state = 'quarantined'",
    )
    .bind(event_id)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn org_by_stripe_customer(pool: &Pool<DB>, customer_id: &str) -> StoreResult<Option<OrgRow>> {
    Ok(sqlx::query_as::<_, OrgRow>("SELECT * FROM orgs WHERE stripe_customer_id = $1")
        .bind(customer_id)
        .fetch_optional(pool)
        .await?)
}

/// Apply Stripe's state to an org: `decide` turns the org's row, read under its lock, into
/// the state to write (or `None`: leave it), which is written unless a later read of
/// Stripe was applied already. Records what changed. `(before, after)` when written.
pub async fn apply_subscription_state<F>(
    pool: &Pool<DB>,
    org_id: &str,
    decide: F,
    source: &str,
    now: Secs,
) -> StoreResult<Option<(OrgRow, OrgRow)>>
where
    F: FnOnce(&OrgRow) -> Option<SubscriptionState> + Send,
{
    let mut tx = begin_write(pool).await?;
    let before = sqlx::query_as::<_, OrgRow>(&format!(
        "SELECT * FROM orgs WHERE org_id = $1{FOR_UPDATE}"
    ))
    .bind(org_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(before) = before else { return Ok(None) };
    let Some(s) = decide(&before) else { return Ok(None) };
    if before.stripe_synced_at.is_some_and(|at| at > s.synced_at) {
        return Ok(None);
    }
    // A downgrade asked for on another subscription, or on one that ended, is void.
    let keep_schedule = before.stripe_subscription_id == s.subscription_id
        && !matches!(s.status.as_deref(), Some("canceled" | "incomplete_expired"));
    let after = sqlx::query_as::<_, OrgRow>(
        "UPDATE orgs SET plan_id = $2, stripe_customer_id = $3, stripe_subscription_id = $4, \
           subscription_status = $5, period_start = $6, period_end = $7, \
           cancel_at_period_end = $8, past_due_since = $9, stripe_synced_at = $10, updated_at = $11, \
           scheduled_plan_id = CASE WHEN $12 THEN scheduled_plan_id ELSE NULL END, \
           scheduled_at = CASE WHEN $12 THEN scheduled_at ELSE NULL END \
         WHERE org_id = $1 RETURNING *",
    )
    .bind(&s.org_id)
    .bind(&s.plan_id)
    .bind(&s.customer_id)
    .bind(&s.subscription_id)
    .bind(&s.status)
    .bind(s.period_start)
    .bind(s.period_end)
    .bind(s.cancel_at_period_end)
    .bind(s.past_due_since)
    .bind(s.synced_at)
    .bind(now)
    .bind(keep_schedule)
    .fetch_one(&mut *tx)
    .await?;
    let changes = crate::billing::sync::describe_changes(&before, &after);
    if !changes.is_empty() {
        record_stripe_change(&mut tx, &s.org_id, source, &changes, now).await?;
    }
    tx.commit().await?;
    Ok(Some((before, after)))
}

async fn record_stripe_change(
    tx: &mut Tx,
    org_id: &str,
    source: &str,
    detail: &str,
    now: Secs,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO stripe_changes (org_id, changed_at, seq, source, detail) \
         SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4 FROM stripe_changes \
         WHERE org_id = $1 AND changed_at = $2",
    )
    .bind(org_id)
    .bind(now)
    .bind(source)
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// An org's billing changes, newest first.
pub async fn list_stripe_changes(
    pool: &Pool<DB>,
    org_id: &str,
    limit: i64,
) -> StoreResult<Vec<(Secs, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT changed_at, source, detail FROM stripe_changes WHERE org_id = $1 \
         ORDER BY changed_at DESC, seq DESC LIMIT $2",
    )
    .bind(org_id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Link an org to its Stripe customer; false if it has another one already.
pub async fn link_stripe_customer(pool: &Pool<DB>, org_id: &str, customer_id: &str, now: Secs) -> StoreResult<bool> {
    let done = sqlx::query(
        "UPDATE orgs SET stripe_customer_id = $2, updated_at = $3 \
         WHERE org_id = $1 AND (stripe_customer_id IS NULL OR stripe_customer_id = $2)",
    )
    .bind(org_id)
    .bind(customer_id)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Record an outbound write before it is sent; returns the unfinished request for its
/// operation and target as stored: this one, or one recorded before (by a crashed attempt,
/// or a concurrent caller), whose idempotency key the caller must then use.
pub async fn begin_stripe_request(pool: &Pool<DB>, r: &StripeRequestRow) -> StoreResult<StripeRequestRow> {
    sqlx::query(
        "INSERT INTO stripe_requests (org_id, operation, idempotency_key, target, created_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(&r.org_id)
    .bind(&r.operation)
    .bind(&r.idempotency_key)
    .bind(&r.target)
    .bind(r.created_at)
    .execute(pool)
    .await?;
    Ok(sqlx::query_as::<_, StripeRequestRow>(
        "SELECT * FROM stripe_requests WHERE org_id = $1 AND operation = $2 AND target = $3 \
           AND completed_at IS NULL",
    )
    .bind(&r.org_id)
    .bind(&r.operation)
    .bind(&r.target)
    .fetch_one(pool)
    .await?)
}

/// The unfinished outbound write of `operation` on `target` for an org, if any: a retry
/// after a crash sends it again with the same idempotency key.
pub async fn open_stripe_request(
    pool: &Pool<DB>,
    org_id: &str,
    operation: &str,
    target: &str,
) -> StoreResult<Option<StripeRequestRow>> {
    Ok(sqlx::query_as::<_, StripeRequestRow>(
        "SELECT * FROM stripe_requests WHERE org_id = $1 AND operation = $2 AND target = $3 \
           AND completed_at IS NULL ORDER BY created_at DESC LIMIT 1",
    )
    .bind(org_id)
    .bind(operation)
    .bind(target)
    .fetch_optional(pool)
    .await?)
}

pub async fn complete_stripe_request(
    pool: &Pool<DB>,
    org_id: &str,
    idempotency_key: &str,
    object_id: &str,
    now: Secs,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE stripe_requests SET completed_at = $3, object_id = $4 \
         WHERE org_id = $1 AND idempotency_key = $2",
    )
    .bind(org_id)
    .bind(idempotency_key)
    .bind(now)
    .bind(object_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Record (`Some((plan, at))`) or clear a downgrade to make at `at`.
pub async fn schedule_plan(pool: &Pool<DB>, org_id: &str, plan: Option<(&str, Secs)>, now: Secs) -> StoreResult<()> {
    sqlx::query("UPDATE orgs SET scheduled_plan_id = $2, scheduled_at = $3, updated_at = $4 WHERE org_id = $1")
        .bind(org_id)
        .bind(plan.map(|p| p.0))
        .bind(plan.map(|p| p.1))
        .bind(now)
        .execute(pool)
        .await?;
    Ok(())
}

/// Orgs with a downgrade whose period has ended.
pub async fn due_downgrades(pool: &Pool<DB>, now: Secs, limit: i64) -> StoreResult<Vec<OrgRow>> {
    Ok(sqlx::query_as::<_, OrgRow>(
        "SELECT * FROM orgs WHERE scheduled_plan_id IS NOT NULL AND scheduled_at <= $1 \
         ORDER BY scheduled_at LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Every org, in id order.
pub async fn list_orgs(pool: &Pool<DB>) -> StoreResult<Vec<OrgRow>> {
    Ok(sqlx::query_as::<_, OrgRow>("SELECT * FROM orgs ORDER BY org_id")
        .fetch_all(pool)
        .await?)
}
