//! The upgrade prompt: whether to tell an org it is about to run out, why, where its usage
//! is heading at the current pace, and the cheapest plan that would fit. Pure: the route
//! gathers the org's standing and its recent concurrency denials.

use rust_decimal::Decimal;
use serde::Serialize;

use crate::charges::money;
use crate::plans::{Plan, Plans};
use crate::standing::WindowUsage;
use crate::time::{rfc3339, Secs};

/// Why the prompt shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PromptReason {
    /// `percent` of the `window` (`month` or `week`) ceiling is used.
    Usage { window: &'static str, percent: u8 },
    /// Runs refused for the key's concurrency limit in the last 24 hours.
    ConcurrencyDenials { count: i64 },
}

/// A window's usage projected to its end at the pace so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Projection {
    pub used_seconds: i64,
    pub projected_seconds: i64,
    pub limit_seconds: i64,
    /// When the ceiling is (or was, if passed) reached at this pace; `None` if not before
    /// the window ends.
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ceiling_at: Option<Secs>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub ends_at: Secs,
}

/// Project `w` from its start to `now` onto the rest of it.
pub fn project(w: &WindowUsage, now: Secs) -> Projection {
    let elapsed = (now - w.start).max(1);
    let used = w.used_seconds;
    let rest = (w.end - now).max(0);
    let projected = used + (i128::from(used) * i128::from(rest) / i128::from(elapsed)) as i64;
    let ceiling_at = if used >= w.limit_seconds {
        Some(now.min(w.end))
    } else if used > 0 {
        let t = now
            + (i128::from(w.limit_seconds - used) * i128::from(elapsed) / i128::from(used)) as i64;
        (t < w.end).then_some(t)
    } else {
        None
    };
    Projection {
        used_seconds: used,
        projected_seconds: projected,
        limit_seconds: w.limit_seconds,
        ceiling_at,
        ends_at: w.end,
    }
}

/// The thresholds of `plan` each window has crossed (the highest per window), then the
/// concurrency denials if there are enough.
pub fn reasons(
    plan: &Plan,
    month: &WindowUsage,
    week: &WindowUsage,
    denials_24h: i64,
) -> Vec<PromptReason> {
    let crossed = |w: &WindowUsage| {
        plan.prompt_thresholds
            .iter()
            .rev()
            .find(|t| {
                i128::from(w.used_seconds) * 100 >= i128::from(**t) * i128::from(w.limit_seconds)
            })
            .copied()
    };
    let mut out = Vec::new();
    for (name, w) in [("month", month), ("week", week)] {
        if let Some(percent) = crossed(w) {
            out.push(PromptReason::Usage {
                window: name,
                percent,
            });
        }
    }
    if plan.prompt_concurrency_denials > 0 && denials_24h >= plan.prompt_concurrency_denials {
        out.push(PromptReason::ConcurrencyDenials { count: denials_24h });
    }
    out
}

/// The cheapest plan dearer than `current` whose ceilings hold both projections, and whose
/// concurrency exceeds `running_limit` when denials are a reason.
pub fn suggest<'p>(
    plans: &'p Plans,
    current: &Plan,
    month: &Projection,
    week: &Projection,
    need_concurrency_above: Option<i64>,
) -> Option<&'p Plan> {
    plans
        .iter()
        .filter(|p| p.price > current.price)
        .filter(|p| p.monthly_limit_seconds >= month.projected_seconds.max(month.used_seconds + 1))
        .filter(|p| p.weekly_limit_seconds >= week.projected_seconds.max(week.used_seconds + 1))
        .filter(|p| need_concurrency_above.is_none_or(|n| p.concurrency_max > n))
        .min_by(|a, b| a.price.cmp(&b.price).then_with(|| a.id.cmp(&b.id)))
}

named! {
    /// A way to go on past the plan.
    pub enum WayKind {
        /// The cheapest dearer plan whose ceilings hold the projection.
        Upgrade = "upgrade",
        /// Top-up packs covering the shortfall.
        Topup = "topup",
        /// Pay-as-you-go for the shortfall.
        Overage = "overage",
    }
}

/// One way on, and what it costs to the period's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Way {
    pub kind: WayKind,
    /// Decimal, in `currency`: the plan's extra price, the packs, or the overage.
    #[schema(value_type = String, example = "5.50")]
    pub cost: String,
    pub currency: String,
    /// The plan to move to (`upgrade`).
    pub plan: Option<String>,
    /// The packs to buy, in hours (`topup`).
    pub packs: Vec<i64>,
    /// The cap pay-as-you-go would need (`overage`): over the plan's maximum, it cannot
    /// cover the shortfall alone.
    #[schema(value_type = Option<String>)]
    pub cap_needed: Option<String>,
    /// Whether this way covers the whole shortfall.
    pub covers: bool,
}

/// Past the plan by the period's end, at this pace: how far, and each way on, cheapest
/// that covers first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WaysOn {
    /// Agent seconds the projection needs beyond the plan and the grants in force.
    pub shortfall_seconds: i64,
    pub ways: Vec<Way>,
    /// The cheapest way that covers the shortfall (`null` when there is none to cover).
    pub cheapest: Option<WayKind>,
}

/// What an org past (or heading past) its plan can do: move up a plan, buy top-up packs,
/// or pay as it goes, each priced for the shortfall its projections show beyond its
/// ceilings and its grants (`grant_seconds` left).
pub fn ways_on(
    plans: &Plans,
    current: &Plan,
    month: &Projection,
    week: &Projection,
    grant_seconds: i64,
) -> WaysOn {
    let past = |p: &Projection| (p.projected_seconds.max(p.used_seconds) - p.limit_seconds).max(0);
    let shortfall = (past(month).max(past(week)) - grant_seconds).max(0);
    if shortfall == 0 {
        return WaysOn {
            shortfall_seconds: 0,
            ways: Vec::new(),
            cheapest: None,
        };
    }
    let mut ways = Vec::new();
    if let Some(p) = suggest(plans, current, month, week, None) {
        ways.push(Way {
            kind: WayKind::Upgrade,
            cost: format!("{:.2}", money(p.price - current.price)),
            currency: p.currency.clone(),
            plan: Some(p.id.clone()),
            packs: Vec::new(),
            cap_needed: None,
            covers: true,
        });
    }
    let hours_needed = (shortfall + 3599) / 3600;
    if let Some(packs) = packs_for(&current.topup_hours, hours_needed) {
        let bought: i64 = packs.iter().sum();
        ways.push(Way {
            kind: WayKind::Topup,
            cost: format!(
                "{:.2}",
                money(Decimal::from(bought) * current.topup_hour_price)
            ),
            currency: current.currency.clone(),
            plan: None,
            packs,
            cap_needed: None,
            covers: true,
        });
    }
    if current.offers_overage() {
        let cost =
            money(Decimal::from(shortfall) * current.overage_unit_price / Decimal::from(3600));
        ways.push(Way {
            kind: WayKind::Overage,
            cost: format!("{cost:.2}"),
            currency: current.currency.clone(),
            plan: None,
            packs: Vec::new(),
            cap_needed: Some(format!("{cost:.2}")),
            covers: cost <= current.overage_cap_max,
        });
    }
    let cheapest = ways
        .iter()
        .filter(|w| w.covers)
        .min_by(|a, b| {
            let cost = |w: &Way| w.cost.parse::<Decimal>().unwrap_or(Decimal::MAX);
            cost(a).cmp(&cost(b))
        })
        .map(|w| w.kind);
    WaysOn {
        shortfall_seconds: shortfall,
        ways,
        cheapest,
    }
}

/// The packs (from `sizes`, hours each) whose hours add up to the fewest at or over
/// `hours`; `None` when the plan sells none.
fn packs_for(sizes: &[i64], hours: i64) -> Option<Vec<i64>> {
    let largest = *sizes.iter().max()?;
    // Whole largest packs first, then the fewest hours that cover the rest (the rest is
    // below the largest pack, so the search is small).
    let whole = (hours / largest - 1).max(0);
    let rest = hours - whole * largest;
    let limit = rest + largest;
    // best[h]: the packs reaching exactly h hours with the fewest packs.
    let mut best: Vec<Option<Vec<i64>>> = vec![None; (limit + 1) as usize];
    best[0] = Some(Vec::new());
    for h in 1..=limit {
        for s in sizes {
            if *s <= h {
                if let Some(prev) = &best[(h - s) as usize] {
                    let mut v = prev.clone();
                    v.push(*s);
                    if best[h as usize].as_ref().is_none_or(|b| v.len() < b.len()) {
                        best[h as usize] = Some(v);
                    }
                }
            }
        }
    }
    let mut packs = (rest..=limit).find_map(|h| best[h as usize].clone())?;
    packs.extend(std::iter::repeat_n(largest, whole as usize));
    packs.sort_unstable_by(|a, b| b.cmp(a));
    Some(packs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Interval;

    fn plans() -> Plans {
        crate::shipped_plans()
    }

    fn window(start: Secs, end: Secs, used: i64, limit: i64) -> WindowUsage {
        WindowUsage::new(Interval::new(start, end).unwrap(), used, limit)
    }

    #[test]
    fn the_pace_so_far_projects_to_the_end() {
        // A third of the window gone, a quarter of the ceiling used: 75% projected.
        let w = window(0, 300, 25, 100);
        let p = project(&w, 100);
        assert_eq!((p.projected_seconds, p.ceiling_at), (75, None));
        // Half gone, 60% used: the ceiling falls at 5/6 of the window.
        let p = project(&window(0, 300, 60, 100), 150);
        assert_eq!((p.projected_seconds, p.ceiling_at), (120, Some(250)));
        // Passed already: now.
        assert_eq!(
            project(&window(0, 300, 100, 100), 150).ceiling_at,
            Some(150)
        );
        assert_eq!(project(&window(0, 300, 0, 100), 150).ceiling_at, None);
    }

    #[test]
    fn the_highest_threshold_crossed_in_each_window() {
        let p = plans();
        let free = p.free();
        let (m, w) = (free.monthly_limit_seconds, free.weekly_limit_seconds);
        assert!(reasons(
            free,
            &window(0, 10, m * 79 / 100, m),
            &window(0, 10, 0, w),
            0
        )
        .is_empty());
        assert_eq!(
            reasons(
                free,
                &window(0, 10, m * 80 / 100, m),
                &window(0, 10, w, w),
                0
            ),
            vec![
                PromptReason::Usage {
                    window: "month",
                    percent: 80
                },
                PromptReason::Usage {
                    window: "week",
                    percent: 100
                }
            ]
        );
        assert_eq!(
            reasons(free, &window(0, 10, 0, m), &window(0, 10, 0, w), 1),
            vec![PromptReason::ConcurrencyDenials { count: 1 }]
        );
    }

    #[test]
    fn the_cheapest_plan_that_holds_the_projection() {
        let p = plans();
        let free = p.free();
        let proj = |projected: i64, limit: i64| Projection {
            used_seconds: 0,
            projected_seconds: projected,
            limit_seconds: limit,
            ceiling_at: None,
            ends_at: 0,
        };
        let small = (proj(6 * 3600, 0), proj(3 * 3600, 0));
        assert_eq!(
            suggest(&p, free, &small.0, &small.1, None).map(|p| p.id.as_str()),
            Some("pro")
        );
        let big = (proj(100 * 3600, 0), proj(20 * 3600, 0));
        assert_eq!(
            suggest(&p, free, &big.0, &big.1, None).map(|p| p.id.as_str()),
            Some("team")
        );
        assert_eq!(
            suggest(&p, free, &small.0, &small.1, Some(10)).map(|p| p.id.as_str()),
            Some("team")
        );
        let huge = (proj(1000 * 3600, 0), proj(20 * 3600, 0));
        assert_eq!(suggest(&p, free, &huge.0, &huge.1, None), None);
    }

    #[test]
    fn packs_cover_the_hours_with_the_fewest_bought() {
        assert_eq!(packs_for(&[5, 10, 25], 1), Some(vec![5]));
        assert_eq!(packs_for(&[5, 10, 25], 12), Some(vec![10, 5]));
        assert_eq!(packs_for(&[5, 10, 25], 26), Some(vec![25, 5]));
        assert_eq!(packs_for(&[5, 10, 25], 60), Some(vec![25, 25, 10]));
        assert_eq!(packs_for(&[], 3), None);
    }

    #[test]
    fn the_cheapest_way_on_is_named() {
        let p = plans();
        let pro = p.get("pro").unwrap();
        let proj = |used: i64, projected: i64, limit: i64| Projection {
            used_seconds: used,
            projected_seconds: projected,
            limit_seconds: limit,
            ceiling_at: None,
            ends_at: 0,
        };
        let week = proj(0, 0, pro.weekly_limit_seconds);
        // 10 hours past the month: a 10-hour top-up (5.50) beats pay-as-you-go (6.00) and
        // Team (180.00 more).
        let month = proj(40 * 3600, 50 * 3600, pro.monthly_limit_seconds);
        let w = ways_on(&p, pro, &month, &week, 0);
        assert_eq!(w.shortfall_seconds, 10 * 3600);
        assert_eq!(w.cheapest, Some(WayKind::Topup));
        let costs: Vec<(WayKind, &str)> =
            w.ways.iter().map(|x| (x.kind, x.cost.as_str())).collect();
        assert_eq!(
            costs,
            [
                (WayKind::Upgrade, "180.00"),
                (WayKind::Topup, "5.50"),
                (WayKind::Overage, "6.00")
            ]
        );
        // 1 hour past: pay-as-you-go (0.60) beats the smallest pack (2.75).
        let month = proj(40 * 3600, 41 * 3600, pro.monthly_limit_seconds);
        assert_eq!(
            ways_on(&p, pro, &month, &week, 0).cheapest,
            Some(WayKind::Overage)
        );
        // Grants in force cover it: nothing to buy.
        assert_eq!(ways_on(&p, pro, &month, &week, 3600).shortfall_seconds, 0);
        // 400 hours past: Team is the only way that covers (the cap stops at 200.00).
        let month = proj(40 * 3600, 380 * 3600, pro.monthly_limit_seconds);
        let w = ways_on(&p, pro, &month, &week, 0);
        assert_eq!(w.cheapest, Some(WayKind::Upgrade));
        assert!(
            !w.ways
                .iter()
                .find(|x| x.kind == WayKind::Overage)
                .unwrap()
                .covers
        );
    }
}
