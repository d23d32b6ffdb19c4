//! An org's usage as the console reads it: its time grouped over a range (the
//! breakdown) and what the upgrade prompt counts.

use std::collections::BTreeMap;

use rush_meter_core::breakdown::{
    by_funding, check_range, group, provisional_pieces, GroupBy, Key, Piece, HOUR,
};
use rush_meter_core::funding::Source;
use rush_meter_core::ledger::Rules;
use rush_meter_core::org::Org;
use rush_meter_core::session::Session;
use rush_meter_core::standing::Standing;
use rush_meter_core::time::{month_window, Interval, Secs};

use super::{Outcome, Refusal, Services};

/// The longest range a breakdown may span.
pub const MAX_BREAKDOWN_DAYS: i64 = 400;

/// A breakdown asked for: how to group, and the range where given (each end defaults to
/// the org's month window, widened to whole hours).
#[derive(Clone, Copy)]
pub struct BreakdownAsk {
    pub by: GroupBy,
    pub from: Option<Secs>,
    pub to: Option<Secs>,
}

impl BreakdownAsk {
    /// The range for an org whose month window is `month`, checked.
    fn range(&self, month: Interval) -> Outcome<Interval> {
        let whole = breakdown_range(month);
        check_range(
            self.from.unwrap_or(whole.start),
            self.to.unwrap_or(whole.end),
            MAX_BREAKDOWN_DAYS,
        )
        .map_err(|m| Refusal::invalid("from", m))
    }
}

/// A breakdown's default range: the month window `month`, widened to whole hours.
pub fn breakdown_range(month: Interval) -> Interval {
    Interval {
        start: month.start.div_euclid(HOUR) * HOUR,
        end: (month.end + HOUR - 1).div_euclid(HOUR) * HOUR,
    }
}

/// An org's time over a range, grouped, running sessions counted up to now.
pub struct Breakdown {
    pub org: Org,
    pub range: Interval,
    pub rows: Vec<(Key, i64)>,
}

/// A funding rollup over a range, by source: (seconds, amount's minor units).
type Booked = BTreeMap<Source, (i64, i64)>;

impl Services {
    /// `ask`'s breakdown of `org_id` at `now`. Its pieces are read beside the org, for the
    /// month the org most likely has (`PeriodGuesses`), and again if its row says
    /// otherwise; by funding, the funding rollup and the standing are read beside them too.
    pub async fn breakdown(
        &self,
        org_id: &str,
        ask: BreakdownAsk,
        now: Secs,
    ) -> Outcome<Breakdown> {
        let guess = ask
            .range(month_window(now, self.periods.period(org_id).await))
            .ok();
        let funding_read = async {
            match (ask.by, guess) {
                (GroupBy::Funding, Some(r)) => Some(self.funding_reads(org_id, r, now).await),
                _ => None,
            }
        };
        let pieces_read = async {
            match guess {
                Some(r) => Some(
                    self.db
                        .session_hour_pieces(org_id, r.start, r.end, ask.by)
                        .await,
                ),
                None => None,
            }
        };
        let (org, guessed, running, funding_read) = tokio::join!(
            self.org(org_id),
            pieces_read,
            self.db.running_sessions(org_id),
            funding_read
        );
        let org = org?;
        self.periods.learn(&org).await;
        let range = ask.range(month_window(now, org.billing_period()))?;
        let mut pieces = match guessed {
            Some(Ok(p)) if guess == Some(range) => p,
            _ => {
                self.db
                    .session_hour_pieces(org_id, range.start, range.end, ask.by)
                    .await?
            }
        };
        add_running(&mut pieces, &running?, range, now, &self.rules);
        let rows = if ask.by == GroupBy::Funding {
            // The standing holds whatever the period; the rollup again for another range.
            let (booked, standing) = match funding_read {
                Some(read) if guess == Some(range) => read,
                Some((_, standing)) => (self.funding_totals(org_id, range).await, standing),
                None => self.funding_reads(org_id, range, now).await,
            };
            funding_rows(&pieces, booked?, &standing?, now)
        } else {
            group(&pieces, ask.by)
        };
        Ok(Breakdown { org, range, rows })
    }

    async fn funding_totals(&self, org_id: &str, range: Interval) -> Outcome<Booked> {
        Ok(self
            .db
            .funding_totals(org_id, range.start, range.end)
            .await?)
    }

    /// The breakdown by funding's own reads, at once: the funding rollup over `range` and
    /// the org's standing at `now`.
    async fn funding_reads(
        &self,
        org_id: &str,
        range: Interval,
        now: Secs,
    ) -> (Outcome<Booked>, Outcome<Standing>) {
        tokio::join!(
            self.funding_totals(org_id, range),
            self.standing(org_id, now)
        )
    }

    /// The org's standing now, and its concurrency denials in the last 24 hours: what the
    /// upgrade prompt weighs.
    pub async fn prompt_reads(&self, org_id: &str, now: Secs) -> Outcome<(Standing, i64)> {
        let s = self.standing(org_id, now).await?;
        let denials = self
            .db
            .count_decisions(org_id, "concurrency_limit_reached", now - 86_400)
            .await?;
        Ok((s, denials))
    }
}

/// The running sessions' time not yet booked, as pieces within `range`.
fn add_running(
    pieces: &mut Vec<Piece>,
    running: &[Session],
    range: Interval,
    now: Secs,
    rules: &Rules,
) {
    for s in running {
        if let Some(stretch) = s.ledger.provisional(now, rules) {
            let template = Piece {
                hour: 0,
                session_id: s.session_id.clone(),
                project_id: s.project_id.clone(),
                started_by: s.started_by.clone(),
                agent: s.agent.clone(),
                seconds: 0,
            };
            pieces.extend(provisional_pieces(&template, stretch, range));
        }
    }
}

/// The breakdown by who paid: what the funding rollup holds for the range (`booked`), and
/// running sessions' time in it (the pieces that name a session) attributed as the org's
/// standing `s` will book it.
fn funding_rows(pieces: &[Piece], booked: Booked, s: &Standing, now: Secs) -> Vec<(Key, i64)> {
    let total: i64 = pieces.iter().map(|p| p.seconds).sum();
    let provisional: i64 = pieces
        .iter()
        .filter(|p| !p.session_id.is_empty())
        .map(|p| p.seconds)
        .sum();
    let mut not_plan: BTreeMap<Source, i64> = booked
        .into_iter()
        .map(|(source, (seconds, _))| (source, seconds))
        .collect();
    for (source, seconds) in s.booked.clone().project(now, provisional) {
        if source != Source::Plan {
            *not_plan.entry(source).or_default() += seconds;
        }
    }
    by_funding(total, &not_plan)
}
