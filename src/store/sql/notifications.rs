//! Usage-threshold notifications (`NotificationStore`), written once for both dialects.

use super::*;

/// A notification recorded once, by its key (org, kind, window start, threshold).
pub(crate) const INSERT_NOTIFICATION: &str =
    "INSERT INTO notifications (org_id, window_kind, window_start, threshold, notification_id, \
       body, state, attempts, next_at, created_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $7) \
     ON CONFLICT DO NOTHING";

/// The notification kind (`window_kind`) of `org.room_restored`, one per wait (its start).
const ROOM_RESTORED: &str = "room_restored";

#[async_trait]
impl NotificationStore for D {
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
        let done = sqlx::query(INSERT_NOTIFICATION)
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
        let queue = Queue {
            table: "notifications",
            key: "notification_id",
            due: "next_at",
            order: "created_at, notification_id",
        };
        let mut tx = begin_write(self.write()).await?;
        // Which orgs have notifications due: read first, so each claim names its orgs.
        let orgs: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT org_id FROM notifications WHERE state = 'pending' AND next_at <= $1 \
             LIMIT $2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut rows: Vec<NotificationRow> = Vec::new();
        for orgs in self
            .by_shard(&mut tx, orgs.iter().map(String::as_str))
            .await?
            .values()
        {
            let left = limit - rows.len() as i64;
            if left <= 0 {
                break;
            }
            rows.extend(
                claim_due::<NotificationRow>(&mut tx, &queue, Some(orgs), now, hold, left).await?,
            );
        }
        tx.commit().await?;
        rows.sort_by(|a, b| {
            (a.created_at, &a.notification_id).cmp(&(b.created_at, &b.notification_id))
        });
        Ok(rows)
    }

    /// A claim that outlived its hold and was taken again must not overwrite the later
    /// outcome: only the holder of `attempts` writes.
    async fn finish_notification(
        &self,
        org_id: &str,
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
             WHERE org_id = $7 AND notification_id = $1 AND state = 'pending' AND attempts = $6",
        )
        .bind(notification_id)
        .bind(state)
        .bind(error)
        .bind(next_at)
        .bind(now)
        .bind(attempts)
        .bind(org_id)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn note_room_wait(&self, w: &RoomWait) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO room_waits (org_id, since, reason, resume_at, plan_id, plan_version, members) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (org_id) DO NOTHING",
        )
        .bind(&w.org_id)
        .bind(w.since)
        .bind(&w.reason)
        .bind(w.resume_at)
        .bind(&w.plan_id)
        .bind(w.plan_version)
        .bind(&w.members)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn room_waits(
        &self,
        after: Option<(Secs, &str)>,
        limit: i64,
    ) -> StoreResult<Vec<RoomWait>> {
        let (since, org) = after.unwrap_or((Secs::MIN, ""));
        Ok(sqlx::query_as(&format!(
            "SELECT * FROM room_waits WHERE since > $1 OR (since = $1 AND org_id{BYTE_ORDER} > $2) \
             ORDER BY since, org_id{BYTE_ORDER} LIMIT $3"
        ))
        .bind(since)
        .bind(org)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }

    async fn parked_since(&self, org_id: &str, since: Secs) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT session_id FROM sessions WHERE org_id = $1 AND phase = 'parked' \
               AND last_at >= $2 ORDER BY session_id{BYTE_ORDER}"
        ))
        .bind(org_id)
        .bind(since)
        .fetch_all(self.read())
        .await?)
    }

    async fn end_room_wait(
        &self,
        org_id: &str,
        since: Secs,
        notification_id: &str,
        body: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        let mut tx = begin_write(self.write()).await?;
        let ended = sqlx::query("DELETE FROM room_waits WHERE org_id = $1 AND since = $2")
            .bind(org_id)
            .bind(since)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if ended {
            sqlx::query(INSERT_NOTIFICATION)
                .bind(org_id)
                .bind(ROOM_RESTORED)
                .bind(since)
                .bind(0_i64)
                .bind(notification_id)
                .bind(body)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(ended)
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
