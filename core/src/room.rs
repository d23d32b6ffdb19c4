//! Why an org's sessions park for want of room, when a reset brings it back, and, once room
//! has returned, what brought it (the `org.room_restored` notification). Pure: the shells
//! read the org's standing before and after.

use serde::Serialize;

use crate::funding::WindowKind;
use crate::standing::Standing;
use crate::time::{format_rfc3339, Secs};

crate::named! {
    /// What ran out, for a session told to park.
    pub enum ParkReason {
        /// The plan's month hours, with nothing past them.
        MonthlyCeiling = "monthly_ceiling",
        /// The plan's week hours, with nothing past them.
        WeeklyCeiling = "weekly_ceiling",
        /// The org's grants, past its plan, with no pay-as-you-go.
        GrantsSpent = "grants_spent",
        /// Pay-as-you-go reached the org's monthly cap.
        SpendCap = "spend_cap",
        /// A limit on the session's user, project or key.
        MemberLimit = "member_limit",
    }
}

crate::named! {
    /// What gave an org room back.
    pub enum RestoredBy {
        /// A month or week window reset.
        WindowReset = "window_reset",
        /// Another plan, or another version of it.
        PlanChanged = "plan_changed",
        /// Grant time: a grant, a top-up.
        Grant = "grant",
        /// Pay-as-you-go turned on, or its cap raised.
        SpendCapRaised = "spend_cap_raised",
        /// A limit inside the org raised or removed.
        LimitChanged = "limit_changed",
    }
}

/// Why the org's sessions park now, and when a window's reset brings its plan room back
/// (`None` while it has room).
pub fn park_reason(s: &Standing) -> Option<(ParkReason, Secs)> {
    if s.remaining_seconds() > 0 {
        return None;
    }
    let state = &s.funding;
    let w = state.windows_at(s.at);
    let month_spent = state.funds(WindowKind::Month, w.month).plan >= state.terms.month_limit;
    let week_spent = state.funds(WindowKind::Week, w.week).plan >= state.terms.week_limit;
    // The plan comes back once every window it is spent in has reset: a new month brings
    // nothing while the week is spent, nor a new week while the month is.
    let resume_at = match (month_spent, week_spent) {
        (true, true) => w.month.end.max(w.week.end),
        (true, false) => w.month.end,
        (false, _) => w.week.end,
    };
    let reason = if state.terms.pay_as_you_go() {
        ParkReason::SpendCap
    } else if state.holds_grants {
        ParkReason::GrantsSpent
    } else if month_spent {
        ParkReason::MonthlyCeiling
    } else {
        ParkReason::WeeklyCeiling
    };
    Some((reason, resume_at))
}

/// Room left by source, for the notification.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoomBySource {
    pub plan: i64,
    pub grant: i64,
    pub overage: i64,
    pub total: i64,
}

/// What gave `now` room back, the org having parked for want of it since a wait that
/// expected a reset at `resume_at` on plan `(plan_id, version)`; `None` while it has none.
pub fn restored_by(now: &Standing, resume_at: Secs, plan: (&str, i64)) -> Option<RestoredBy> {
    if now.remaining_seconds() == 0 {
        return None;
    }
    let state = &now.funding;
    let w = state.windows_at(now.at);
    let by = if (now.plan.id.as_str(), now.plan.version) != plan {
        RestoredBy::PlanChanged
    } else if now.at >= resume_at && state.plan_room(&w) > 0 {
        RestoredBy::WindowReset
    } else if state.grant_room(now.at) > 0 {
        RestoredBy::Grant
    } else if state.overage_room(&w) > 0 {
        RestoredBy::SpendCapRaised
    } else {
        RestoredBy::WindowReset
    };
    Some(by)
}

/// What gave room back to an org whose sessions parked at limits inside it, waiting since
/// a wait that expected the limits' week to reset at `resume_at`: `None` while one of the
/// members it waited on is still spent (`still_spent`) or the org itself has no room.
pub fn member_restored_by(
    now: &Standing,
    still_spent: bool,
    resume_at: Secs,
) -> Option<RestoredBy> {
    if still_spent || now.remaining_seconds() == 0 {
        return None;
    }
    Some(if now.at >= resume_at {
        RestoredBy::WindowReset
    } else {
        RestoredBy::LimitChanged
    })
}

/// The room `s` has, by source.
pub fn room_by_source(s: &Standing) -> RoomBySource {
    let state = &s.funding;
    let w = state.windows_at(s.at);
    let room = RoomBySource {
        plan: state.plan_room(&w),
        grant: state.grant_room(s.at),
        overage: state.overage_room(&w),
        total: 0,
    };
    RoomBySource {
        total: room.plan + room.grant + room.overage,
        ..room
    }
}

#[derive(Serialize)]
struct Body<'a> {
    id: &'a str,
    kind: &'static str,
    created_at: String,
    org_id: &'a str,
    reason: &'static str,
    /// The sessions that parked for want of room while it lasted.
    sessions: &'a [String],
    remaining_seconds: RoomBySource,
    as_of: String,
}

/// The id of the notification that an org's wait for room since `since` ended: one per
/// wait, whichever instance sees it.
pub fn restored_id(org_id: &str, since: Secs) -> String {
    format!("room_restored:{org_id}:{since}")
}

/// The JSON body of `org.room_restored`.
pub fn restored_body(s: &Standing, since: Secs, by: RestoredBy, sessions: &[String]) -> String {
    serde_json::to_string(&Body {
        id: &restored_id(&s.org.org_id, since),
        kind: "org.room_restored",
        created_at: format_rfc3339(s.at),
        org_id: &s.org.org_id,
        reason: by.as_str(),
        sessions,
        remaining_seconds: room_by_source(s),
        as_of: format_rfc3339(s.at),
    })
    .expect("a notification serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::funding::{Recorded, WindowFunds};
    use crate::org::Org;
    use crate::standing::WindowTotals;
    use crate::time::Windows;

    /// Monday 2026-11-30 12:00 UTC.
    const T0: Secs = 1_796_040_000;

    /// An org on Free (5 h a month, 2 h a week) whose plan funded `month` and `week`.
    fn standing(org: &Org, now: Secs, month: i64, week: i64) -> Standing {
        let plans = crate::shipped_plans();
        let w = Windows::at(now, None);
        let funds = |plan| crate::funding::Funds {
            plan,
            ..Default::default()
        };
        let recorded = Recorded {
            windows: vec![
                WindowFunds {
                    kind: WindowKind::Month,
                    window: w.month,
                    funds: funds(month),
                },
                WindowFunds {
                    kind: WindowKind::Week,
                    window: w.week,
                    funds: funds(week),
                },
            ],
            floor: w.month.start.min(w.week.start),
            ..Recorded::default()
        };
        let used = WindowTotals {
            month,
            week,
            ..WindowTotals::default()
        };
        Standing::of(org.clone(), &plans, now, used, recorded)
    }

    #[test]
    fn a_spent_week_parks_until_monday_and_a_spent_month_until_the_next() {
        let org = Org::new("o", "free", 0);
        let s = standing(&org, T0, 3 * 3600, 2 * 3600);
        let monday = T0 + 7 * 86_400 - 12 * 3600;
        assert_eq!(park_reason(&s), Some((ParkReason::WeeklyCeiling, monday)));
        // Both spent: the week outlasts the month.
        let s = standing(&org, T0, 5 * 3600, 2 * 3600);
        assert_eq!(park_reason(&s), Some((ParkReason::MonthlyCeiling, monday)));
        let dec1 = T0 + 12 * 3600;
        let s = standing(&org, T0, 5 * 3600, 3600);
        assert_eq!(park_reason(&s), Some((ParkReason::MonthlyCeiling, dec1)));
        assert_eq!(park_reason(&standing(&org, T0, 3600, 3600)), None);
    }

    #[test]
    fn room_back_is_put_down_to_what_gave_it() {
        let org = Org::new("o", "free", 0);
        let waiting = standing(&org, T0, 5 * 3600, 2 * 3600);
        assert_eq!(restored_by(&waiting, T0 + 12 * 3600, ("free", 1)), None);
        // December: both windows start again.
        let dec = standing(&org, T0 + 12 * 3600 + 1, 0, 0);
        assert_eq!(
            restored_by(&dec, T0 + 12 * 3600, ("free", 1)),
            Some(RestoredBy::WindowReset)
        );
        let mut pro = org.clone();
        pro.plan_id = "pro".into();
        let upgraded = standing(&pro, T0, 5 * 3600, 2 * 3600);
        assert_eq!(
            restored_by(&upgraded, T0 + 12 * 3600, ("free", 1)),
            Some(RestoredBy::PlanChanged)
        );
        let body: serde_json::Value = serde_json::from_str(&restored_body(
            &upgraded,
            T0 - 60,
            RestoredBy::PlanChanged,
            &["s1".into()],
        ))
        .unwrap();
        assert_eq!(body["kind"], "org.room_restored");
        assert_eq!(body["sessions"], serde_json::json!(["s1"]));
        // Pro: 40 h a month, 15 h a week; 2 h of the week used.
        assert_eq!(body["remaining_seconds"]["plan"], 13 * 3600);
        assert_eq!(body["remaining_seconds"]["total"], 13 * 3600);
    }

    #[test]
    fn room_back_at_a_limit_is_a_limit_changed_or_its_week_reset() {
        let org = Org::new("o", "free", 0);
        let has_room = standing(&org, T0, 3600, 3600);
        let monday = T0 + 7 * 86_400 - 12 * 3600;
        assert_eq!(member_restored_by(&has_room, true, monday), None);
        assert_eq!(
            member_restored_by(&has_room, false, monday),
            Some(RestoredBy::LimitChanged)
        );
        let next_week = standing(&org, monday, 3600, 0);
        assert_eq!(
            member_restored_by(&next_week, false, monday),
            Some(RestoredBy::WindowReset)
        );
        // The member has room, the org none: not yet.
        let spent = standing(&org, T0, 5 * 3600, 2 * 3600);
        assert_eq!(member_restored_by(&spent, false, monday), None);
    }
}
