//! Property tests of limits inside an org (core/src/members.rs, docs/limits.md): member
//! time cut into buckets loses and moves no second, a limit is spent exactly when its use
//! reaches it, the gate names the first spent limit in the order user, project, key, and
//! heartbeat answers never give a member more room than its limits leave.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rush_meter_core::members::*;
use rush_meter_core::time::{iso_week, Interval, Secs, Windows, HOUR};
use rust_decimal::Decimal;

/// Monday 2026-11-23 00:00 UTC.
const T0: Secs = 1_795_392_000;
const DAY: Secs = 86_400;

/// Month windows that start at `start` and every 30 days after (a Stripe period starts at
/// any second), and the calendar before it.
fn windows_from(start: Secs) -> impl Fn(Secs) -> Windows {
    move |t: Secs| {
        let month = if t < start {
            Interval::new(start - 30 * DAY, start).unwrap()
        } else {
            let k = (t - start).div_euclid(30 * DAY);
            Interval::new(start + k * 30 * DAY, start + (k + 1) * 30 * DAY).unwrap()
        };
        Windows {
            month,
            week: iso_week(t),
        }
    }
}

fn kind() -> impl Strategy<Value = LimitKind> {
    prop_oneof![
        Just(LimitKind::User),
        Just(LimitKind::Project),
        Just(LimitKind::Key)
    ]
}

/// Hours with up to 4 places, as `parse_hours` takes them, or no limit.
fn hours() -> impl Strategy<Value = Option<Decimal>> {
    prop::option::of((0i64..200_000).prop_map(|h| Decimal::new(h, 4)))
}

fn limit() -> impl Strategy<Value = Limit> {
    (kind(), 0u8..3, hours(), hours()).prop_map(|(kind, member, monthly, weekly)| Limit {
        org_id: "o".into(),
        kind,
        member_id: format!("m{member}"),
        monthly_hours: monthly,
        weekly_hours: weekly,
        created_at: 0,
        updated_at: 0,
    })
}

/// At most one limit a member, as the store keeps them (kind and member are its key).
fn limits() -> impl Strategy<Value = Vec<Limit>> {
    prop::collection::vec(limit(), 0..8).prop_map(|ls| {
        let mut by_member = BTreeMap::new();
        for l in ls {
            by_member.insert((l.kind, l.member_id.clone()), l);
        }
        by_member.into_values().collect()
    })
}

fn usage() -> impl Strategy<Value = MemberUsage> {
    let dims = prop_oneof![
        Just(Dimension::User),
        Just(Dimension::Project),
        Just(Dimension::Key),
        Just(Dimension::Agent)
    ];
    prop::collection::vec((dims, 0u8..3, 0i64..80, 0i64..80), 0..12).prop_map(|rows| {
        rows.into_iter()
            .map(|(d, m, month, week)| ((d, format!("m{m}")), (month * 90, week * 90)))
            .collect()
    })
}

fn used_by(l: &Limit, used: &MemberUsage) -> (i64, i64) {
    used.get(&(l.kind.dimension(), l.member_id.clone()))
        .copied()
        .unwrap_or_default()
}

proptest! {
    #[test]
    fn buckets_keep_every_second_in_its_hour_and_month(
        from in 0i64..(3 * DAY),
        len in 1i64..(2 * DAY),
        month_start in 0i64..(3 * DAY),
    ) {
        let windows_at = windows_from(T0 + month_start);
        let interval = Interval::new(T0 + from, T0 + from + len).unwrap();
        let got = buckets(interval, &windows_at);
        prop_assert_eq!(got.iter().map(|b| b.1).sum::<i64>(), len);
        // Pieces follow each other; each lies in one hour and one month window, and is
        // filed under the later of its hour's start and its month's start.
        let mut t = interval.start;
        for &(bucket, seconds) in &got {
            prop_assert!(seconds > 0);
            let hour = t.div_euclid(HOUR) * HOUR;
            let month = windows_at(t).month;
            prop_assert_eq!(bucket, hour.max(month.start));
            prop_assert!(t + seconds <= hour + HOUR && t + seconds <= month.end);
            prop_assert!(month.contains(bucket));
            t += seconds;
        }
        prop_assert_eq!(t, interval.end);
    }

    #[test]
    fn a_limit_is_spent_exactly_when_its_use_reaches_it(ls in limits(), used in usage()) {
        for l in &ls {
            let u = used_by(l, &used);
            let month = l.monthly_seconds();
            let week = l.weekly_seconds();
            // Rounded down to whole seconds: never more than the hours asked for.
            if let (Some(h), Some(s)) = (l.monthly_hours, month) {
                prop_assert!(Decimal::from(s) <= h * Decimal::from(3600));
                prop_assert!(Decimal::from(s + 1) > h * Decimal::from(3600));
            }
            let spent = month.is_some_and(|m| u.0 >= m) || week.is_some_and(|w| u.1 >= w);
            prop_assert_eq!(l.spent(u), spent);
            prop_assert_eq!(l.remaining(u) == 0, spent);
        }
    }

    #[test]
    fn the_gate_names_the_first_spent_limit_user_then_project_then_key(
        ls in limits(),
        used in usage(),
    ) {
        let first = spent_limit(&ls, &used);
        let spent: Vec<&Limit> = ls.iter().filter(|l| l.spent(used_by(l, &used))).collect();
        match first {
            None => prop_assert!(spent.is_empty()),
            Some(f) => {
                prop_assert!(f.spent(used_by(f, &used)));
                prop_assert!(spent.iter().all(|l| l.kind >= f.kind));
            }
        }
    }

    #[test]
    fn rooms_never_exceed_what_a_limit_leaves_and_park_only_past_the_grace(
        ls in limits(),
        used in usage(),
        grace in 0i64..600,
    ) {
        let rooms = rooms(&ls, &used, grace);
        prop_assert_eq!(rooms.len(), ls.len());
        for l in &ls {
            let u = used_by(l, &used);
            let room = rooms[&(l.kind.dimension(), l.member_id.clone())];
            if let Some(m) = l.monthly_seconds() {
                prop_assert!(room.remaining_seconds <= (m - u.0).max(0));
            }
            if let Some(w) = l.weekly_seconds() {
                prop_assert!(room.remaining_seconds <= (w - u.1).max(0));
            }
            // Parked only once a limit is spent and the grace has run past it.
            let past = |limit: Option<i64>, used: i64| limit.is_some_and(|s| used >= s + grace);
            prop_assert_eq!(room.park, past(l.monthly_seconds(), u.0) || past(l.weekly_seconds(), u.1));
            if room.park {
                prop_assert!(l.spent(u));
            }
        }
    }
}

proptest! {
    /// Whatever the billing period and however late the time arrives (before the floor of
    /// a closed period), each member's buckets of an hour hold exactly the seconds the
    /// org's rollup holds for that hour: a member never used more than its org in any
    /// window (`within_reach` relies on it).
    #[test]
    fn member_time_is_filed_in_the_hours_of_the_org_time(
        floor in 0i64..(20 * DAY),
        period_start in proptest::option::of(0i64..(20 * DAY)),
        stretches in proptest::collection::vec((0i64..(40 * DAY), 1i64..(5 * HOUR)), 1..6),
    ) {
        use rush_meter_core::booking::Booking;
        use rush_meter_core::funding::{State, Terms};
        use rush_meter_core::ledger::Effects;
        use rush_meter_core::session::Session;
        let period = period_start.map(|s| Interval::new(T0 + s, T0 + s + 30 * DAY).unwrap());
        let mut b = Booking::default();
        for (i, (start, len)) in stretches.iter().enumerate() {
            let mut s = Session::admitted("o", &format!("s{i}"), T0 + start);
            s.started_by = Some(format!("u{}", i % 2));
            let billed = Interval::new(T0 + start, T0 + start + len);
            b.add(&s, &Effects { billed, closed: vec![], ignored: false });
        }
        let terms = Terms { month_limit: i64::MAX / 4, week_limit: i64::MAX / 4, price_units: 0, cap_units: 0 };
        let mut states = BTreeMap::from([("o".to_owned(), State::new(terms, period, T0 + floor, [], vec![]))]);
        b.fund(&mut states);
        for dim in Dimension::ALL {
            let mut by_hour: BTreeMap<(String, Secs), i64> = BTreeMap::new();
            for ((org, bucket, d, _), secs) in &b.member_hours {
                if d == dim {
                    *by_hour.entry((org.clone(), bucket.div_euclid(HOUR) * HOUR)).or_default() += secs;
                }
            }
            prop_assert_eq!(&by_hour, &b.org_hours, "{:?}", dim);
        }
    }
}
