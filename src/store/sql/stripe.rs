//! Stripe's tables (`StripeStore`), written once for both dialects.

use super::*;

/// Record that `customer` is `org`'s (a Stripe customer belongs to one org), in the
/// transaction that links them; false if it is another org's.
async fn claim_customer(tx: &mut Tx, customer: &str, org: &str) -> StoreResult<bool> {
    sqlx::query(
        "INSERT INTO stripe_customers (customer_id, org_id) VALUES ($1, $2) \
         ON CONFLICT DO NOTHING",
    )
    .bind(customer)
    .bind(org)
    .execute(&mut **tx)
    .await?;
    let owner: String =
        sqlx::query_scalar("SELECT org_id FROM stripe_customers WHERE customer_id = $1")
            .bind(customer)
            .fetch_one(&mut **tx)
            .await?;
    Ok(owner == org)
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

/// An org's former customer is no longer its.
async fn release_customer(tx: &mut Tx, customer: &str, org: &str) -> StoreResult<()> {
    sqlx::query("DELETE FROM stripe_customers WHERE customer_id = $1 AND org_id = $2")
        .bind(customer)
        .bind(org)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Store a webhook event `(id, type, created, payload)` as received: pending, or
/// quarantined with why. False if its id was stored before.
async fn insert_event(
    pool: &Pool<DB>,
    (event_id, kind, created, payload): (&str, &str, Secs, &str),
    api_version: Option<&str>,
    quarantined: Option<&str>,
    now: Secs,
) -> StoreResult<bool> {
    let done = sqlx::query(
        "INSERT INTO stripe_events (event_id, type, created, payload, received_at, state, \
           attempts, next_attempt_at, api_version, last_error) \
         VALUES ($1, $2, $3, $4, $5, CASE WHEN $7 IS NULL THEN 'pending' ELSE 'quarantined' END, \
           0, $5, $6, $7) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(kind)
    .bind(created)
    .bind(payload)
    .bind(now)
    .bind(api_version)
    .bind(quarantined)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

#[async_trait]
impl StripeStore for D {
    async fn insert_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        created: Secs,
        api_version: Option<&str>,
        payload: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        let event = (event_id, kind, created, payload);
        insert_event(self.write(), event, api_version, None, now).await
    }

    async fn quarantine_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        created: Secs,
        payload: &str,
        why: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        let event = (event_id, kind, created, payload);
        insert_event(self.write(), event, None, Some(why), now).await
    }

    async fn claim_stripe_events(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>> {
        // Events arrive before their org is known: a table shared by every org (a
        // reference table on Citus), claimed whole. A claim writes every copy of a
        // reference table (each worker's, in a two-phase commit); a read is answered by
        // one, the coordinator's: look first, claim only what is due.
        let due: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM stripe_events \
               WHERE state = 'pending' AND next_attempt_at <= $1)",
        )
        .bind(now)
        .fetch_one(self.read())
        .await?;
        if !due {
            return Ok(Vec::new());
        }
        let queue = Queue {
            table: "stripe_events",
            key: "event_id",
            due: "next_attempt_at",
            order: "created, event_id",
        };
        let mut tx = begin_write(self.write()).await?;
        let mut rows: Vec<StripeEventRow> =
            claim_due(&mut tx, &queue, None, now, hold, limit).await?;
        tx.commit().await?;
        rows.sort_by(|a, b| (a.created, &a.event_id).cmp(&(b.created, &b.event_id)));
        Ok(rows)
    }

    async fn finish_stripe_event(
        &self,
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
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn list_stripe_events(
        &self,
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
        .fetch_all(self.read())
        .await?)
    }

    async fn requeue_stripe_event(&self, event_id: &str, now: Secs) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE stripe_events SET state = 'pending', attempts = 0, next_attempt_at = $2, \
               processed_at = NULL WHERE event_id = $1 AND state = 'quarantined'",
        )
        .bind(event_id)
        .bind(now)
        .execute(self.write())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn org_by_stripe_customer(&self, customer_id: &str) -> StoreResult<Option<Org>> {
        let owner: Option<String> =
            sqlx::query_scalar("SELECT org_id FROM stripe_customers WHERE customer_id = $1")
                .bind(customer_id)
                .fetch_optional(self.read())
                .await?;
        match owner {
            Some(org) => self.get_org(&org).await,
            None => Ok(None),
        }
    }

    async fn apply_subscription_state(
        &self,
        org_id: &str,
        decide: DecideState<'_>,
        source: &str,
        now: Secs,
    ) -> StoreResult<Option<(Org, Org)>> {
        let mut tx = begin_write(self.write()).await?;
        let Some(before) = org_for_update(&mut tx, org_id).await? else {
            return Ok(None);
        };
        let Some(s) = decide(&before) else {
            return Ok(None);
        };
        // Older than what is applied: a lower ticket, or (states taken from events' own
        // content, without tickets) an earlier time.
        let older = match s.ticket {
            Some(t) => t <= before.stripe_applied_seq,
            None => before.stripe_synced_at.is_some_and(|at| at > s.synced_at),
        };
        if older {
            return Ok(None);
        }
        // A downgrade asked for on another subscription, or on one that ended, is void; one
        // whose plan this state puts the org on is done, and so is one made in Stripe whose
        // time has come (a state read since replaces it: an upgrade from it, say).
        let keep_schedule = before.stripe_subscription_id == s.subscription_id
            && !matches!(s.status.as_deref(), Some("canceled" | "incomplete_expired"))
            && before.scheduled_plan_id.as_deref() != Some(s.plan_id.as_str())
            && !(before.scheduled_in_stripe
                && before.scheduled_at.is_some_and(|at| at <= s.synced_at));
        let Rec(after) = sqlx::query_as::<_, Rec<Org>>(
            "UPDATE orgs SET plan_id = $2, stripe_customer_id = $3, stripe_subscription_id = $4, \
               subscription_status = $5, period_start = $6, period_end = $7, \
               cancel_at_period_end = $8, past_due_since = $9, stripe_synced_at = $10, updated_at = $11, \
               scheduled_plan_id = CASE WHEN $12 THEN scheduled_plan_id ELSE NULL END, \
               scheduled_at = CASE WHEN $12 THEN scheduled_at ELSE NULL END, \
               scheduled_in_stripe = CASE WHEN $12 THEN scheduled_in_stripe ELSE FALSE END, \
               stripe_applied_seq = COALESCE($13, stripe_applied_seq), \
               plan_version = $14, \
               moving_to_version = CASE WHEN plan_id = $2 THEN moving_to_version END, \
               moving_at = CASE WHEN plan_id = $2 THEN moving_at END \
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
        .bind(s.ticket)
        .bind(s.plan_version)
        .fetch_one(&mut *tx)
        .await?;
        if before.stripe_customer_id.as_deref() != Some(s.customer_id.as_str()) {
            if !claim_customer(&mut tx, &s.customer_id, &s.org_id).await? {
                return Err(StoreError::Conflict(format!(
                    "Stripe customer {} belongs to another org than {}",
                    s.customer_id, s.org_id
                )));
            }
            if let Some(old) = &before.stripe_customer_id {
                release_customer(&mut tx, old, &s.org_id).await?;
            }
        }
        let changes = rush_meter_core::org::describe_changes(&before, &after);
        if !changes.is_empty() {
            record_stripe_change(&mut tx, &s.org_id, source, &changes, now).await?;
        }
        let entry = change(
            &s.org_id,
            now,
            &Actor::stripe(source),
            Action::SubscriptionSynced,
            s.org_id.clone(),
            Some(rush_meter_core::audit::subscription_state(&before)),
            Some(rush_meter_core::audit::subscription_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(Some((before, after)))
    }

    async fn list_stripe_changes(
        &self,
        org_id: &str,
        limit: i64,
    ) -> StoreResult<Vec<(Secs, String, String)>> {
        Ok(sqlx::query_as(
            "SELECT changed_at, source, detail FROM stripe_changes WHERE org_id = $1 \
             ORDER BY changed_at DESC, seq DESC LIMIT $2",
        )
        .bind(org_id)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }

    async fn link_stripe_customer(
        &self,
        org_id: &str,
        customer_id: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        let mut tx = begin_write(self.write()).await?;
        if !claim_customer(&mut tx, customer_id, org_id).await? {
            return Ok(false);
        }
        let done = sqlx::query(
            "UPDATE orgs SET stripe_customer_id = $2, updated_at = $3 \
             WHERE org_id = $1 AND (stripe_customer_id IS NULL OR stripe_customer_id = $2)",
        )
        .bind(org_id)
        .bind(customer_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn begin_stripe_request(&self, r: &StripeRequestRow) -> StoreResult<StripeRequestRow> {
        sqlx::query(
            "INSERT INTO stripe_requests (org_id, operation, idempotency_key, target, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(&r.org_id)
        .bind(&r.operation)
        .bind(&r.idempotency_key)
        .bind(&r.target)
        .bind(r.created_at)
        .execute(self.write())
        .await?;
        Ok(sqlx::query_as::<_, StripeRequestRow>(
            "SELECT * FROM stripe_requests WHERE org_id = $1 AND operation = $2 AND target = $3 \
               AND completed_at IS NULL",
        )
        .bind(&r.org_id)
        .bind(&r.operation)
        .bind(&r.target)
        .fetch_one(self.write())
        .await?)
    }

    async fn open_stripe_request(
        &self,
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
        .fetch_optional(self.write())
        .await?)
    }

    async fn complete_stripe_request(
        &self,
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
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn rekey_stripe_request(
        &self,
        org_id: &str,
        idempotency_key: &str,
        new_key: &str,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE stripe_requests SET idempotency_key = $3 \
             WHERE org_id = $1 AND idempotency_key = $2 AND completed_at IS NULL",
        )
        .bind(org_id)
        .bind(idempotency_key)
        .bind(new_key)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn stripe_ticket(&self, org_id: &str) -> StoreResult<Option<i64>> {
        // A short write of its own: no lock is held while Stripe is read.
        Ok(sqlx::query_scalar(
            "UPDATE orgs SET stripe_seq = stripe_seq + 1 WHERE org_id = $1 RETURNING stripe_seq",
        )
        .bind(org_id)
        .fetch_optional(self.write())
        .await?)
    }

    async fn schedule_plan(
        &self,
        org_id: &str,
        plan: Option<(&str, Secs)>,
        in_stripe: bool,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<()> {
        let mut tx = begin_write(self.write()).await?;
        let Some(before) = org_for_update(&mut tx, org_id).await? else {
            return Ok(());
        };
        let Rec(after) = sqlx::query_as::<_, Rec<Org>>(
            "UPDATE orgs SET scheduled_plan_id = $2, scheduled_at = $3, scheduled_in_stripe = $4, \
               updated_at = $5 WHERE org_id = $1 RETURNING *",
        )
        .bind(org_id)
        .bind(plan.map(|p| p.0))
        .bind(plan.map(|p| p.1))
        .bind(in_stripe && plan.is_some())
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            org_id,
            now,
            actor,
            Action::DowngradeScheduled,
            org_id.to_owned(),
            Some(rush_meter_core::audit::downgrade_state(&before)),
            Some(rush_meter_core::audit::downgrade_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(())
    }
}
