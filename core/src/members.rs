//! Inside an org: agent time by member (project, user, agent, API key), and the hour
//! limits an org sets on its users, projects and keys (docs/limits.md).
//!
//! Member time is rolled up in the transaction that books it, by *bucket*: a UTC hour, cut
//! where the org's month window starts inside it (a Stripe period starts at any second), so
//! that a window's use is the sum of the buckets that start in it, to the second, and an
//! hour's is the sum of the buckets that start in it. Time is filed where it ran, late time
//! too (funding counts that in the open month), so that a member's buckets of an hour
//! hold the seconds the org's rollup holds for it.

use std::collections::BTreeMap;

use rust_decimal::Decimal;

use crate::session::Session;
use crate::time::{Interval, Secs, Windows, HOUR};

named! {
    /// What agent time is rolled up by, inside an org.
    pub enum Dimension {
        Project = "project",
        User = "user",
        Agent = "agent",
        Key = "key",
    }
}

named! {
    /// What an org may limit: the admission's `started_by`, `project_id` or `key_id`.
    pub enum LimitKind {
        User = "user",
        Project = "project",
        Key = "key",
    }
}

impl LimitKind {
    pub fn dimension(self) -> Dimension {
        match self {
            LimitKind::User => Dimension::User,
            LimitKind::Project => Dimension::Project,
            LimitKind::Key => Dimension::Key,
        }
    }
}

/// A session's member in `dim` ("" when it has none: no project, no user).
pub fn member_of(s: &Session, dim: Dimension) -> &str {
    match dim {
        Dimension::Project => s.project_id.as_deref(),
        Dimension::User => s.started_by.as_deref(),
        Dimension::Agent => s.agent.as_deref(),
        Dimension::Key => s.key_id.as_deref(),
    }
    .unwrap_or("")
}

/// `interval` cut into buckets: `(bucket start, seconds)`, cut at every UTC hour and where
/// the month window of `windows_at` changes.
pub fn buckets(interval: Interval, windows_at: impl Fn(Secs) -> Windows) -> Vec<(Secs, i64)> {
    let mut out = Vec::new();
    let mut t = interval.start;
    while t < interval.end {
        let month = windows_at(t).month;
        let hour = t.div_euclid(HOUR) * HOUR;
        let stop = interval.end.min(hour + HOUR).min(month.end);
        out.push((hour.max(month.start), stop - t));
        t = stop;
    }
    out
}

/// An hour limit an org set on one of its users, projects or keys: `None` is no limit in
/// that window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub org_id: String,
    pub kind: LimitKind,
    pub member_id: String,
    pub monthly_hours: Option<Decimal>,
    pub weekly_hours: Option<Decimal>,
    pub created_at: Secs,
    pub updated_at: Secs,
}

/// The most hours a limit may be.
pub const MAX_LIMIT_HOURS: i64 = 100_000;

impl Limit {
    /// Whole seconds of a limit in hours, rounded down (a limit never grants a part second).
    pub fn seconds(hours: Option<Decimal>) -> Option<i64> {
        hours.map(|h| i64::try_from((h * Decimal::from(3600)).floor()).unwrap_or(i64::MAX))
    }

    pub fn monthly_seconds(&self) -> Option<i64> {
        Self::seconds(self.monthly_hours)
    }

    pub fn weekly_seconds(&self) -> Option<i64> {
        Self::seconds(self.weekly_hours)
    }

    /// Whether `used` (month, week) has reached either window's limit.
    pub fn spent(&self, used: (i64, i64)) -> bool {
        self.monthly_seconds().is_some_and(|l| used.0 >= l)
            || self.weekly_seconds().is_some_and(|l| used.1 >= l)
    }

    /// Whether the limit may be spent when its org has used `org_used` (month, week) in the
    /// same windows. A member's seconds are its org's, cut into buckets at the org's window
    /// edges, so a member never used more than its org; the hour of margin covers a bucket
    /// cut at an edge the org has since moved (a bucket is at most an hour). A limit out of
    /// reach needs no read of its member's use: the gate reads that only for the others.
    pub fn within_reach(&self, org_used: (i64, i64)) -> bool {
        self.spent((
            org_used.0.saturating_add(HOUR),
            org_used.1.saturating_add(HOUR),
        ))
    }

    /// Seconds left before the first of its windows' limits (`i64::MAX` with none).
    pub fn remaining(&self, used: (i64, i64)) -> i64 {
        let m = self
            .monthly_seconds()
            .map_or(i64::MAX, |l| (l - used.0).max(0));
        let w = self
            .weekly_seconds()
            .map_or(i64::MAX, |l| (l - used.1).max(0));
        m.min(w)
    }
}

/// A limit's hours as asked for: a decimal string, at least 0 and at most
/// `MAX_LIMIT_HOURS`, with at most 4 places; `None` is no limit.
pub fn parse_hours(
    field: &'static str,
    text: Option<&str>,
) -> Result<Option<Decimal>, crate::funding::Invalid> {
    let Some(text) = text else { return Ok(None) };
    let bad = || {
        crate::funding::Invalid {
        field,
        message: format!(
            "{field} must be a decimal number of hours from 0 to {MAX_LIMIT_HOURS} with at most 4 places, such as \"12.5\", or null for no limit (got `{text}`)"
        ),
    }
    };
    let h = crate::charges::parse_decimal(text).ok_or_else(bad)?;
    if h.is_sign_negative() || h > Decimal::from(MAX_LIMIT_HOURS) || h.round_dp(4) != h {
        return Err(bad());
    }
    Ok(Some(h))
}

/// Seconds each member used in a window, by `(dimension, member)`: what the rollup holds
/// and what running sessions have run since (counted up to now).
pub type MemberUsage = BTreeMap<(Dimension, String), (i64, i64)>;

/// The first of `limits` (user, project, key: the order they are checked in) whose member
/// `used` has spent it.
pub fn spent_limit<'l>(limits: &'l [Limit], used: &MemberUsage) -> Option<&'l Limit> {
    let mut sorted: Vec<&Limit> = limits.iter().collect();
    sorted.sort_by_key(|l| l.kind);
    sorted.into_iter().find(|l| {
        let u = used
            .get(&(l.kind.dimension(), l.member_id.clone()))
            .copied()
            .unwrap_or_default();
        l.spent(u)
    })
}

/// The members of `limits` whose use the gate must read, given their org's use (month,
/// week) in the same windows: those of limits within reach of it (`Limit::within_reach`).
pub fn members_within_reach(limits: &[Limit], org_used: (i64, i64)) -> Vec<&str> {
    limits
        .iter()
        .filter(|l| l.within_reach(org_used))
        .map(|l| l.member_id.as_str())
        .collect()
}

/// What heartbeat answers tell the sessions of a limited member: seconds before its
/// first limit, and whether they must park.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberRoom {
    pub remaining_seconds: i64,
    pub park: bool,
}

/// The room of every member `limits` name. Sessions park once a limit is spent and the
/// plan's grace (`grace` seconds) has run past it, as they do at the org's ceilings: a
/// session admitted with a second of room is not cut off mid-turn. Admission refuses at
/// the limit itself, so the grace is the only time a member can run past it.
pub fn rooms(
    limits: &[Limit],
    used: &MemberUsage,
    grace: i64,
) -> BTreeMap<(Dimension, String), MemberRoom> {
    let mut out: BTreeMap<(Dimension, String), MemberRoom> = BTreeMap::new();
    for l in limits {
        let key = (l.kind.dimension(), l.member_id.clone());
        let u = used.get(&key).copied().unwrap_or_default();
        let past =
            |limit: Option<i64>, used: i64| limit.is_some_and(|l| used >= l.saturating_add(grace));
        let room = MemberRoom {
            remaining_seconds: l.remaining(u),
            park: past(l.monthly_seconds(), u.0) || past(l.weekly_seconds(), u.1),
        };
        out.insert(key, room);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cut_at_hours_and_where_a_month_starts() {
        // A month window that starts at 10:20 (a Stripe period), on the day of 0.
        let start = 10 * HOUR + 1200;
        let windows_at = |t: Secs| Windows {
            month: if t < start {
                Interval::new(0, start).unwrap()
            } else {
                Interval::new(start, start + 30 * 86_400).unwrap()
            },
            week: crate::time::iso_week(t),
        };
        let got = buckets(
            Interval::new(10 * HOUR + 1000, 11 * HOUR + 100).unwrap(),
            windows_at,
        );
        assert_eq!(got, [(10 * HOUR, 200), (start, 2400), (11 * HOUR, 100)]);
        let total: i64 = got.iter().map(|b| b.1).sum();
        assert_eq!(total, HOUR - 1000 + 100);
    }

    #[test]
    fn a_limit_is_spent_in_either_window_and_hours_are_checked() {
        let l = Limit {
            org_id: "o".into(),
            kind: LimitKind::Project,
            member_id: "web".into(),
            monthly_hours: Some("1".parse().unwrap()),
            weekly_hours: None,
            created_at: 0,
            updated_at: 0,
        };
        assert!(!l.spent((3599, 1_000_000)));
        assert!(l.spent((3600, 0)));
        assert_eq!(l.remaining((600, 0)), 3000);
        assert_eq!(
            parse_hours("monthly_hours", Some("12.5")).unwrap(),
            Some("12.5".parse().unwrap())
        );
        assert_eq!(parse_hours("monthly_hours", None).unwrap(), None);
        let used: MemberUsage = [((Dimension::Project, "web".to_owned()), (3600 + 59, 0))].into();
        let room =
            rooms(std::slice::from_ref(&l), &used, 60)[&(Dimension::Project, "web".to_owned())];
        assert_eq!(
            room,
            MemberRoom {
                remaining_seconds: 0,
                park: false
            }
        );
        let used: MemberUsage = [((Dimension::Project, "web".to_owned()), (3600 + 60, 0))].into();
        assert!(
            rooms(std::slice::from_ref(&l), &used, 60)[&(Dimension::Project, "web".to_owned())]
                .park
        );
        for bad in ["-1", "lots", "100001", "0.00001"] {
            let e = parse_hours("weekly_hours", Some(bad)).unwrap_err();
            assert_eq!(e.field, "weekly_hours", "{bad}");
        }
    }

    #[test]
    fn the_gate_reads_the_use_of_members_whose_limits_are_within_reach() {
        let limit = |member: &str, monthly: &str| Limit {
            org_id: "o".into(),
            kind: LimitKind::User,
            member_id: member.into(),
            monthly_hours: Some(monthly.parse().unwrap()),
            weekly_hours: None,
            created_at: 0,
            updated_at: 0,
        };
        // The org used 2 h this month: a 3 h limit is within the hour's margin, 10 h is not.
        let limits = [limit("ann", "3"), limit("bob", "10"), limit("cy", "2")];
        assert_eq!(
            members_within_reach(&limits, (2 * HOUR, 2 * HOUR)),
            ["ann", "cy"]
        );
        assert!(members_within_reach(&limits, (0, 0)).is_empty());
    }

    proptest::proptest! {
        /// The gate skips the use of limits out of reach of their org's use: no member whose
        /// use is at most its org's (plus the margin) has spent such a limit, and a limit
        /// its org's use alone has spent is always within reach.
        #[test]
        fn a_limit_out_of_reach_of_its_orgs_use_is_not_spent(
            monthly in proptest::option::of(0i64..20_000),
            weekly in proptest::option::of(0i64..20_000),
            org in (0i64..20_000, 0i64..20_000),
            below in (0i64..20_000, 0i64..20_000),
        ) {
            let hours = |s: Option<i64>| s.map(|s| Decimal::new(s, 0) / Decimal::from(3600));
            let l = Limit {
                org_id: "o".into(),
                kind: LimitKind::User,
                member_id: "ann".into(),
                monthly_hours: hours(monthly),
                weekly_hours: hours(weekly),
                created_at: 0,
                updated_at: 0,
            };
            let member = ((org.0 + HOUR - below.0).max(0), (org.1 + HOUR - below.1).max(0));
            if !l.within_reach(org) {
                proptest::prop_assert!(!l.spent(member), "{l:?} spent by {member:?} of {org:?}");
            }
            if l.spent(org) {
                proptest::prop_assert!(l.within_reach(org));
            }
        }
    }
}
