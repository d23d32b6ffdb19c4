//! The upgrade prompt: whether to tell an org it is about to run out, why, where its usage
//! is heading at the current pace, and the cheapest plan that would fit. Pure: the route
//! gathers the org's standing and its recent concurrency denials.

use serde::Serialize;

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
}
