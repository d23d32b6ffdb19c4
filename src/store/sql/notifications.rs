// Usage-threshold notifications (`NotificationStore`), written once for both dialects.

#[async_trait]
impl NotificationStore for Backend {
    /// The key makes it once per threshold per window, across every instance.
    async fn insert_notification(
        &self,
        org_id: &str,
        window_kind: &str,
        window_start: Secs,
        threshold: i64,
        notification_id: &str,
        body: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "INSERT INTO notifications (org_id, window_kind, window_start, threshold, notification_id, \
               body, state, attempts, next_at, created_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $7) \
             ON CONFLICT DO NOTHING",
        )
        .bind(org_id)
        .bind(window_kind)
        .bind(window_start)
        .bind(threshold)
        .bind(notification_id)
        .bind(body)
        .bind(now)
        .execute(self.write())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn claim_notifications(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>> {
        let mut rows: Vec<NotificationRow> = claim_due(
            self.write(),
            "notifications",
            "notification_id",
            "next_at",
            "created_at, notification_id",
            now,
            hold,
            limit,
        )
        .await?;
        rows.sort_by(|a, b| {
            (a.created_at, &a.notification_id).cmp(&(b.created_at, &b.notification_id))
        });
        Ok(rows)
    }

    /// A claim that outlived its hold and was taken again must not overwrite the later
    /// outcome: only the holder of `attempts` writes.
    async fn finish_notification(
        &self,
        notification_id: &str,
        attempts: i64,
        state: &str,
        error: Option<&str>,
        next_at: Secs,
        now: Secs,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE notifications SET state = $2, last_error = $3, next_at = $4, \
               sent_at = CASE WHEN $2 = 'sent' THEN $5 ELSE sent_at END \
             WHERE notification_id = $1 AND state = 'pending' AND attempts = $6",
        )
        .bind(notification_id)
        .bind(state)
        .bind(error)
        .bind(next_at)
        .bind(now)
        .bind(attempts)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn list_notifications(
        &self,
        org_id: Option<&str>,
        state: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>> {
        Ok(sqlx::query_as::<_, NotificationRow>(
            "SELECT * FROM notifications WHERE ($1 IS NULL OR org_id = $1) AND ($2 IS NULL OR state = $2) \
             ORDER BY created_at DESC, notification_id DESC LIMIT $3",
        )
        .bind(org_id)
        .bind(state)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }
}
