//! A Team member's own page (`GET /v1/me/usage`): the user's use in its org's windows and by
//! day, the limits set on the user, the time left to it as one figure, and its running and
//! parked sessions; never the org's own totals.

use rush_meter_core::members::{Dimension, Limit, LimitKind};
use rush_meter_core::own_use::{own_use, OwnUse};
use rush_meter_core::plans::Plan;
use rush_meter_core::session::Session;
use rush_meter_core::time::{Interval, Secs, Windows};

use super::usage::breakdown_range;
use super::{Outcome, Services};

/// What a member's page shows.
pub struct MemberPage {
    pub org_id: String,
    pub user_id: String,
    /// The org's plan (its name and version; not its totals).
    pub plan: Plan,
    pub windows: Windows,
    /// The range `usage.days` covers: the month window in whole hours, the default range of
    /// the org's usage breakdown.
    pub range: Interval,
    pub usage: OwnUse,
    /// The limit set on the user, if any.
    pub limit: Option<Limit>,
    /// Seconds the user may still run: the least of its limit's room and the org's.
    pub time_left_seconds: i64,
    pub sessions: Vec<Session>,
}

impl Services {
    /// `user_id`'s page in `org_id` at `now`.
    pub async fn member_page(&self, org_id: &str, user_id: &str, now: Secs) -> Outcome<MemberPage> {
        let standing = self.standing(org_id, now).await?;
        let windows = Windows {
            month: Interval {
                start: standing.month.start,
                end: standing.month.end,
            },
            week: Interval {
                start: standing.week.start,
                end: standing.week.end,
            },
        };
        let range = breakdown_range(windows.month);
        let hull = (
            range.start.min(windows.week.start),
            range.end.max(windows.week.end),
        );
        let orgs = [&standing.org];
        let (hours, sessions, limits) = tokio::join!(
            self.db
                .member_hours(org_id, Dimension::User, user_id, hull.0, hull.1),
            self.db.open_sessions_of_user(org_id, user_id),
            self.db.limits_with_usage(&orgs, now, &self.rules),
        );
        let sessions = sessions?;
        let running: Vec<Interval> = sessions
            .iter()
            .filter_map(|s| s.ledger.provisional(now, &self.rules))
            .collect();
        let usage = own_use(&hours?, &running, &windows, range);
        let limit = limits?.remove(org_id).and_then(|(limits, _)| {
            limits
                .into_iter()
                .find(|l| l.kind == LimitKind::User && l.member_id == user_id)
        });
        let own_room = limit.as_ref().map_or(i64::MAX, |l| {
            l.remaining((usage.month_seconds, usage.week_seconds))
        });
        Ok(MemberPage {
            org_id: org_id.to_owned(),
            user_id: user_id.to_owned(),
            time_left_seconds: own_room.min(standing.remaining_seconds()),
            plan: standing.plan,
            windows,
            range,
            usage,
            limit,
            sessions,
        })
    }
}
