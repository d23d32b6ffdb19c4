//! The funding rules, case by case (the properties are `core/tests/funding_props.rs`).

use super::*;

const DAY: Secs = 86_400;
/// Monday 2026-11-30 00:00 UTC.
const MON: Secs = 1_795_996_800;

fn terms(month: i64, week: i64, price: i64, cap: i64) -> Terms {
    Terms {
        month_limit: month,
        week_limit: week,
        price_units: price,
        cap_units: cap,
    }
}

fn grant(id: &str, seconds: i64, priority: i64, expires_at: Option<Secs>) -> Grant {
    Grant {
        org_id: "o".into(),
        grant_id: id.into(),
        kind: GrantKind::Promo,
        seconds,
        used_seconds: 0,
        priority,
        starts_at: 0,
        expires_at,
        note: None,
        idempotency_key: None,
        created_at: 0,
        voided_at: None,
        used_up_at: None,
    }
}

/// A state whose floor is the month of `now`.
fn state(t: Terms, now: Secs, grants: Vec<Grant>) -> State {
    let floor = crate::time::calendar_month(now).start;
    State::new(t, None, floor, [], grants)
}

fn sources(pieces: &[Piece]) -> Vec<(Source, i64, Option<&str>)> {
    pieces
        .iter()
        .map(|p| (p.source, p.interval.len(), p.grant_id.as_deref()))
        .collect()
}

#[test]
fn monday_is_a_monday() {
    assert_eq!(crate::time::iso_week(MON).start, MON);
}

#[test]
fn plan_then_grants_by_priority_then_overage_then_grace() {
    let now = MON + DAY;
    let mut s = state(
        terms(100, 100, 2, 40),
        now,
        vec![grant("late", 10, 60, None), grant("first", 10, 10, None)],
    );
    let pieces = s.fund("s", Interval::new(now, now + 150).unwrap());
    assert_eq!(
        sources(&pieces),
        [
            (Source::Plan, 100, None),
            (Source::Grant, 10, Some("first")),
            (Source::Grant, 10, Some("late")),
            (Source::Overage, 20, None),
            (Source::Grace, 10, None),
        ]
    );
    let w = s.windows_at(now);
    let m = s.funds(WindowKind::Month, w.month);
    assert_eq!(
        (m.plan, m.grant, m.overage, m.grace, m.charge_units),
        (100, 20, 20, 10, 40)
    );
    assert_eq!(m.total(), 150);
    assert_eq!(s.remaining_at(now), 0);
}

#[test]
fn the_weekly_ceiling_limits_plan_hours_only() {
    let now = MON + DAY;
    let mut s = state(terms(1000, 50, 0, 0), now, vec![grant("g", 30, 50, None)]);
    let p = s.fund("s", Interval::new(now, now + 100).unwrap());
    assert_eq!(
        sources(&p),
        [
            (Source::Plan, 50, None),
            (Source::Grant, 30, Some("g")),
            (Source::Grace, 20, None)
        ]
    );
    // Next week the plan pays again: the month has room.
    let next = MON + 7 * DAY;
    let p = s.fund("s", Interval::new(next, next + 10).unwrap());
    assert_eq!(sources(&p), [(Source::Plan, 10, None)]);
}

#[test]
fn a_grant_funds_only_while_in_force() {
    let now = MON + DAY;
    let mut g = grant("g", 1000, 50, Some(now + 30));
    g.starts_at = now + 10;
    let mut s = state(terms(0, 0, 0, 0), now, vec![g]);
    let p = s.fund("s", Interval::new(now, now + 50).unwrap());
    assert_eq!(
        sources(&p),
        [
            (Source::Grace, 10, None),
            (Source::Grant, 20, Some("g")),
            (Source::Grace, 20, None)
        ]
    );
    assert_eq!(s.grants[0].used_seconds, 20);
}

#[test]
fn soonest_expiry_then_oldest_break_ties_of_priority() {
    let mut a = grant("a", 5, 50, None);
    let b = grant("b", 5, 50, Some(1_000_000));
    let mut c = grant("c", 5, 50, None);
    a.created_at = 2;
    c.created_at = 1;
    let mut v = [a, b, c];
    v.sort_by(funding_order);
    let ids: Vec<_> = v.iter().map(|g| g.grant_id.as_str()).collect();
    assert_eq!(ids, ["b", "c", "a"]);
}

#[test]
fn a_span_across_a_week_boundary_is_funded_in_each_week() {
    let sunday = MON + 6 * DAY;
    let end = MON + 7 * DAY;
    let mut s = state(terms(1000, 40, 0, 0), sunday, vec![]);
    s.fund("s", Interval::new(end - 30, end).unwrap());
    let p = s.fund("s", Interval::new(end - 20, end + 20).unwrap());
    assert_eq!(
        sources(&p),
        [
            (Source::Plan, 10, None),
            (Source::Grace, 10, None),
            (Source::Plan, 20, None)
        ]
    );
}

#[test]
fn late_time_is_funded_in_its_own_windows_until_its_month_is_closed() {
    let dec = 1_796_083_200;
    let mut open = State::new(terms(100, 100, 0, 0), None, 0, [], vec![]);
    open.fund("s", Interval::new(dec - 10, dec + 5).unwrap());
    let nov = crate::time::calendar_month(dec - 1);
    assert_eq!(open.funds(WindowKind::Month, nov).plan, 10);
    // November closed: its late time is funded in December.
    let mut s = state(terms(100, 100, 0, 0), dec + 60, vec![]);
    assert_eq!(s.floor, dec);
    let p = s.fund("s", Interval::new(dec - 10, dec + 5).unwrap());
    assert_eq!(
        sources(&p),
        [(Source::Plan, 10, None), (Source::Plan, 5, None)]
    );
    let nov = crate::time::calendar_month(dec - 1);
    assert_eq!(s.funds(WindowKind::Month, nov), Funds::default());
    let w = s.windows_at(dec);
    assert_eq!(s.funds(WindowKind::Month, w.month).plan, 15);
}

#[test]
fn the_cap_is_never_passed_in_money() {
    let now = MON + DAY;
    // 0.35 an hour: 3500 units a second; a cap of 1.00 is 36,000,000 units.
    let cap = money_units(Decimal::new(100, 2));
    let mut s = state(terms(0, 0, 3500, cap), now, vec![]);
    let p = s.fund("s", Interval::new(now, now + 20_000).unwrap());
    let overage = p.iter().find(|p| p.source == Source::Overage).unwrap();
    assert_eq!(overage.interval.len(), 10_285);
    let w = s.windows_at(now);
    let m = s.funds(WindowKind::Month, w.month);
    assert!(m.overage_amount() <= Decimal::new(100, 2));
    assert_eq!(m.overage_amount(), Decimal::new(100, 2));
    assert_eq!(m.grace, 20_000 - 10_285);
}

#[test]
fn prices_and_amounts_are_exact() {
    assert_eq!(price_units("0.35".parse().unwrap()), Some(3500));
    assert_eq!(price_units("0.12345".parse().unwrap()), None);
    // 36 s at 0.50 an hour is half a cent: rounds away from zero.
    assert_eq!(amount(36 * 5000), "0.01".parse::<Decimal>().unwrap());
    assert_eq!(amount(35 * 5000), Decimal::ZERO);
}

#[test]
fn park_once_spent_and_the_grace_has_run() {
    let now = MON + DAY;
    let mut s = state(terms(100, 100, 0, 0), now, vec![]);
    s.fund("s", Interval::new(now, now + 100).unwrap());
    assert!(!must_park(&s, now + 100, 30));
    s.fund("s", Interval::new(now + 100, now + 129).unwrap());
    assert!(!must_park(&s, now + 129, 30));
    s.fund("s", Interval::new(now + 129, now + 130).unwrap());
    assert!(must_park(&s, now + 130, 30));
    // No grace: at once.
    let mut s = state(terms(100, 100, 0, 0), now, vec![]);
    s.fund("s", Interval::new(now, now + 100).unwrap());
    assert!(must_park(&s, now + 100, 0));
}

#[test]
fn the_hourly_rollup_holds_what_is_not_the_plans() {
    let now = MON + DAY;
    let mut s = state(terms(10, 10, 5000, money_units(Decimal::ONE)), now, vec![]);
    let p = s.fund("s", Interval::new(now + 3590, now + 3620).unwrap());
    let h = hourly(&p);
    assert_eq!(h.len(), 1);
    let ((hour, source, _), (secs, units)) = h.into_iter().next().unwrap();
    assert_eq!(
        (hour, source, secs, units),
        (now + 3600, Source::Overage, 20, 100_000)
    );
}
