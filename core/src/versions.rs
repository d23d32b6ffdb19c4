//! Moving orgs between versions of their plan: when a move takes effect and what it does
//! to each org's room (pure; the store schedules it, `Org::plan_version_at` applies it).

use serde::Serialize;

use crate::plans::Plan;
use crate::time::{format_rfc3339, Interval, Secs, Windows};

/// When a move takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// With the org's next billing period (its Stripe period's end, else the next
    /// calendar month): the period it has paid for keeps its terms.
    Renewal,
    /// At the org's next decision; the window's use so far counts against the new terms.
    Now,
    /// At this time (not before now).
    At(Secs),
}

impl When {
    /// `renewal`, `now`, or an RFC 3339 time; the error says what is accepted.
    pub fn parse(text: &str) -> Result<When, String> {
        match text {
            "renewal" => Ok(When::Renewal),
            "now" => Ok(When::Now),
            t => crate::time::rfc3339::parse(t).map(When::At).map_err(|_| {
                format!(
                    "`{t}` is not `renewal`, `now` or an RFC 3339 time such as \
                     2027-01-01T00:00:00Z"
                )
            }),
        }
    }

    /// The time the move takes effect for an org billed over `period` (none: calendar
    /// months), asked at `now`.
    pub fn time(self, now: Secs, period: Option<Interval>) -> Secs {
        match self {
            When::Now => now,
            When::At(at) => at.max(now),
            When::Renewal => Windows::at(now, period).month.end,
        }
    }
}

/// What a move does to one org: its plan room in each window on the version it leaves and
/// on the one it goes to, from what it has used so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct MovePreview {
    pub org_id: String,
    pub plan: String,
    pub from_version: i64,
    pub to_version: i64,
    /// When it takes effect (RFC 3339).
    #[schema(format = DateTime)]
    pub at: String,
    pub month_used_seconds: i64,
    pub week_used_seconds: i64,
    pub month_remaining_seconds_before: i64,
    pub month_remaining_seconds_after: i64,
    pub week_remaining_seconds_before: i64,
    pub week_remaining_seconds_after: i64,
}

/// The preview of moving `org_id` from `from` to `to` at `at`, having used `month` and
/// `week` seconds of its current windows.
pub fn preview(
    org_id: &str,
    from: &Plan,
    to: &Plan,
    at: Secs,
    (month, week): (i64, i64),
) -> MovePreview {
    let room = |limit: i64, used: i64| (limit - used).max(0);
    MovePreview {
        org_id: org_id.to_owned(),
        plan: from.id.clone(),
        from_version: from.version,
        to_version: to.version,
        at: format_rfc3339(at),
        month_used_seconds: month,
        week_used_seconds: week,
        month_remaining_seconds_before: room(from.monthly_limit_seconds, month),
        month_remaining_seconds_after: room(to.monthly_limit_seconds, month),
        week_remaining_seconds_before: room(from.weekly_limit_seconds, week),
        week_remaining_seconds_after: room(to.weekly_limit_seconds, week),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_the_next_period_and_dates_are_never_past() {
        let period = Interval::new(1_000, 2_000);
        assert_eq!(When::Renewal.time(1_500, period), 2_000);
        assert_eq!(When::Now.time(1_500, period), 1_500);
        assert_eq!(When::At(100).time(1_500, period), 1_500);
        assert_eq!(When::At(9_000).time(1_500, period), 9_000);
        // Calendar months without a Stripe period: 2026-12-06 renews on 2027-01-01.
        let dec6 = crate::time::rfc3339::parse("2026-12-06T10:00:00Z").unwrap();
        let jan1 = crate::time::rfc3339::parse("2027-01-01T00:00:00Z").unwrap();
        assert_eq!(When::Renewal.time(dec6, None), jan1);
        assert!(When::parse("tomorrow").unwrap_err().contains("renewal"));
        assert_eq!(When::parse("2027-01-01T00:00:00Z"), Ok(When::At(jan1)));
    }

    #[test]
    fn a_preview_shows_the_room_on_both_versions() {
        let plans = crate::shipped_plans();
        let one = plans.get("pro").unwrap().clone();
        let mut two = one.clone();
        two.version = 2;
        two.monthly_limit_seconds = 30 * 3600;
        let p = preview("o", &one, &two, 0, (35 * 3600, 3600));
        assert_eq!(
            (
                p.month_remaining_seconds_before,
                p.month_remaining_seconds_after
            ),
            (5 * 3600, 0)
        );
        assert_eq!(p.week_remaining_seconds_after, 14 * 3600);
    }
}
