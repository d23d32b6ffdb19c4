//! Property tests of funding (src/funding.rs, DESIGN.md rule 9): every billed second has
//! exactly one source, sources are used in order, no source pays past its room, and how
//! the time is cut into bookings changes nothing.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rush_meter_core::funding::*;
use rush_meter_core::time::{Interval, Secs};

/// Monday 2026-11-23 00:00 UTC: a week before a month's end, so runs cross both.
const T0: Secs = 1_795_392_000;
const DAY: Secs = 86_400;

fn grant() -> impl Strategy<Value = Grant> {
    (
        1i64..4000,
        0i64..=100,
        0i64..(10 * DAY),
        prop::option::of(1i64..(10 * DAY)),
        0i64..1000,
    )
        .prop_map(|(seconds, priority, start, len, created)| Grant {
            org_id: "o".into(),
            grant_id: format!("g{created:04}_{priority}_{seconds}"),
            kind: GrantKind::Promo,
            seconds,
            used_seconds: 0,
            priority,
            starts_at: T0 + start - DAY,
            expires_at: len.map(|l| T0 + start - DAY + l),
            note: None,
            idempotency_key: None,
            created_at: created,
            voided_at: None,
            used_up_at: None,
        })
}

fn terms() -> impl Strategy<Value = Terms> {
    (
        0i64..20_000,
        0i64..10_000,
        prop_oneof![Just(0i64), 1i64..6000],
        0i64..(5000 * 3000),
    )
        .prop_map(|(month, week, price, cap)| Terms {
            month_limit: month,
            week_limit: week,
            price_units: price,
            cap_units: if price > 0 { cap } else { 0 },
        })
}

/// Billed stretches of a few sessions over ten days, in booking order.
fn bookings() -> impl Strategy<Value = Vec<(String, Interval)>> {
    prop::collection::vec((0usize..4, 0i64..(10 * DAY), 1i64..5000), 1..40).prop_map(|v| {
        let mut v: Vec<(String, Interval)> = v
            .into_iter()
            .map(|(s, start, len)| {
                (
                    format!("s{s}"),
                    Interval::new(T0 + start, T0 + start + len).unwrap(),
                )
            })
            .collect();
        v.sort_by_key(|(_, i)| i.start);
        v
    })
}

/// Funding open from the month ten days before `now`: everything the runs book.
fn floor(now: Secs) -> Secs {
    rush_meter_core::time::calendar_month(now - 10 * DAY).start
}

fn fund_all(state: &mut State, bookings: &[(String, Interval)]) -> Vec<Piece> {
    bookings
        .iter()
        .flat_map(|(s, i)| state.fund(s, *i))
        .collect()
}

/// Funds by window, summed from the pieces.
fn by_window(state: &State, pieces: &[Piece]) -> BTreeMap<(WindowKind, Secs), Funds> {
    let mut out: BTreeMap<(WindowKind, Secs), Funds> = BTreeMap::new();
    for p in pieces {
        let w = state.windows_at(p.interval.start);
        for (kind, window) in [(WindowKind::Month, w.month), (WindowKind::Week, w.week)] {
            let f = out.entry((kind, window.start)).or_default();
            let n = p.interval.len();
            match p.source {
                Source::Plan => f.plan += n,
                Source::Grant => f.grant += n,
                Source::Overage => f.overage += n,
                Source::Grace => f.grace += n,
            }
            f.charge_units += p.charge_units;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn every_second_has_one_source_and_no_source_pays_past_its_room(
        t in terms(),
        grants in prop::collection::vec(grant(), 0..5),
        bookings in bookings(),
    ) {
        let now = bookings.last().unwrap().1.end;
        let mut state = State::new(t, None, floor(now), [], grants.clone());
        let pieces = fund_all(&mut state, &bookings);

        // The pieces of a booking cover it exactly, in order.
        let mut it = pieces.iter();
        for (s, i) in &bookings {
            let mut at = i.start;
            while at < i.end {
                let p = it.next().expect("a piece for every second");
                prop_assert_eq!(&p.session_id, s);
                prop_assert_eq!(p.interval.start, at);
                at = p.interval.end;
            }
            prop_assert_eq!(at, i.end);
        }
        prop_assert!(it.next().is_none());

        // What the state counts is what the pieces say, window by window.
        let counted = by_window(&state, &pieces);
        for ((kind, start), f) in &counted {
            let w = state.windows[&(*kind, *start)];
            prop_assert_eq!(&w.funds, f);
            let limit = match kind {
                WindowKind::Month => t.month_limit,
                WindowKind::Week => t.week_limit,
            };
            prop_assert!(f.plan <= limit, "plan {} past {}", f.plan, limit);
            if *kind == WindowKind::Month {
                prop_assert!(f.charge_units <= t.cap_units);
                prop_assert!(amount(f.charge_units) <= amount(t.cap_units));
            }
        }
        for g in &state.grants {
            prop_assert!(g.used_seconds <= g.seconds);
            let used: i64 = pieces
                .iter()
                .filter(|p| p.grant_id.as_deref() == Some(g.grant_id.as_str()))
                .inspect(|p| assert!(g.in_force(p.interval.start) && g.in_force(p.interval.end - 1)))
                .map(|p| p.interval.len())
                .sum();
            prop_assert_eq!(used, g.used_seconds);
        }

        // In order: a later source pays only once every earlier one was spent (rooms only
        // shrink, so what is left at the end had room all along).
        for p in &pieces {
            let w = state.windows_at(p.interval.start);
            if p.source != Source::Plan {
                prop_assert_eq!(state.plan_room(&w), 0);
            }
            if matches!(p.source, Source::Overage | Source::Grace) {
                prop_assert!(state.grants.iter().all(|g| !g.in_force(p.interval.start) || g.remaining() == 0));
            }
            if p.source == Source::Grace {
                prop_assert_eq!(state.overage_room(&w), 0);
            }
        }

        // The hourly rollup holds every second that is not the plan's.
        let hourly = hourly(&pieces);
        let rolled: i64 = hourly.values().map(|(s, _)| s).sum();
        let not_plan: i64 = pieces.iter().filter(|p| p.source != Source::Plan).map(|p| p.interval.len()).sum();
        prop_assert_eq!(rolled, not_plan);
        let units: i64 = hourly.values().map(|(_, u)| u).sum();
        prop_assert_eq!(units, pieces.iter().map(|p| p.charge_units).sum::<i64>());
    }

    #[test]
    fn how_time_is_cut_into_bookings_changes_nothing(
        t in terms(),
        grants in prop::collection::vec(grant(), 0..5),
        bookings in bookings(),
        cuts in prop::collection::vec(1i64..5000, 40),
    ) {
        let now = bookings.last().unwrap().1.end;
        let mut whole = State::new(t, None, floor(now), [], grants.clone());
        let mut pieces = State::new(t, None, floor(now), [], grants);
        fund_all(&mut whole, &bookings);
        let cut: Vec<(String, Interval)> = bookings
            .iter()
            .zip(&cuts)
            .flat_map(|((s, i), c)| {
                let mid = i.start + c % i.len();
                [Interval::new(i.start, mid), Interval::new(mid, i.end)]
                    .into_iter()
                    .flatten()
                    .map(move |part| (s.clone(), part))
            })
            .collect();
        fund_all(&mut pieces, &cut);
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn readers_split_adds_up_to_what_was_used(
        t in terms(),
        grants in prop::collection::vec(grant(), 0..5),
        bookings in bookings(),
    ) {
        let now = bookings.last().unwrap().1.end;
        let mut state = State::new(t, None, floor(now), [], grants);
        fund_all(&mut state, &bookings);
        for w in state.windows.values() {
            let split = Split::of(w.funds.total(), &w.funds);
            prop_assert_eq!(split.plan, w.funds.plan);
            prop_assert_eq!(split.plan + split.grant + split.overage + split.grace, w.funds.total());
        }
    }
}
