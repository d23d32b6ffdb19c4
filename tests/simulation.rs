//! The seeded fleet simulation (src/sim/), checked against the true running time, and
//! replayed through the store on SQLite and PostgreSQL against the pure core's reference.
//!
//! A failing seed is printed; replay it with `RUSH_METER_SIM_SEED=<seed> cargo test --test simulation`.

mod common;

use std::collections::BTreeMap;

use common::{fresh_database, Backend};
use rush_meter::sim::{self, Delivery, Fleet, Params, Reference};
use rush_meter::store::{Db, OrgUpsert};
use rush_meter_core::audit::{Action, Actor};
use rush_meter_core::breakdown::GroupBy;
use rush_meter_core::funding::{Grant, GrantKind, Overage, WindowKind};
use rush_meter_core::heartbeats::Heartbeat;
use rush_meter_core::ledger::{Interval, Secs};
use rush_meter_core::members::{Limit, LimitKind};

/// The expiry job's period in simulated time.
const EXPIRE_EVERY: Secs = 300;

fn seeds() -> Vec<u64> {
    match std::env::var("RUSH_METER_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("RUSH_METER_SIM_SEED is a number")],
        Err(_) => vec![1, 2, 3],
    }
}

fn replay_hint(seed: u64) -> String {
    format!("seed {seed}; replay with RUSH_METER_SIM_SEED={seed} cargo test --test simulation")
}

/// Check the reference ledger of a fleet against the truth, session by session.
fn check_against_truth(seed: u64, fleet: &Fleet, reference: &Reference) -> (usize, i64, i64) {
    let rules = fleet.params.rules;
    let mut exact = 0;
    let (mut over_total, mut under_total) = (0, 0);
    for truth in &fleet.truths {
        let Some(s) = reference.sessions.get(&truth.session) else {
            // Every heartbeat of this session was lost: nothing billed, all of it under.
            under_total += truth.running_seconds();
            continue;
        };
        for w in s.billed.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "{}: double count {w:?} in {}",
                replay_hint(seed),
                truth.session
            );
        }
        let over = sim::uncovered(&s.billed, &truth.running);
        let under = sim::uncovered(&truth.running, &s.billed);
        let b = sim::bound(truth, &s.applied, s.ended_at, &rules);
        assert!(
            over <= b.over && under <= b.under,
            "{}: session {} billed {} s for {} s running: over {over} (bound {}), under {under} (bound {})",
            replay_hint(seed),
            truth.session,
            s.ledger.billed_seconds,
            truth.running_seconds(),
            b.over,
            b.under
        );
        if over == 0 && under == 0 {
            exact += 1;
        }
        over_total += over;
        under_total += under;
    }
    (exact, over_total, under_total)
}

#[test]
fn the_pure_ledger_stays_within_the_bound_for_every_seed() {
    for seed in seeds() {
        let fleet = sim::generate(seed, &Params::acceptance());
        let reference = reference_of(&fleet);
        let (exact, over, under) = check_against_truth(seed, &fleet, &reference);
        let truth: i64 = fleet.truths.iter().map(|t| t.running_seconds()).sum();
        let billed: i64 = reference
            .sessions
            .values()
            .map(|s| s.ledger.billed_seconds)
            .sum();
        eprintln!(
            "seed {seed}: {} heartbeats sent, {} delivered; {} sessions, {exact} billed exactly; \
             truth {truth} s, billed {billed} s, over {over} s, under {under} s",
            fleet.beats_sent,
            fleet.beats_delivered,
            fleet.truths.len()
        );
        assert!(fleet.beats_sent >= 100_000);
        assert_eq!(billed, truth + over - under, "{}", replay_hint(seed));
        // When the expiry job runs changes nothing, even with late deliveries.
        let mut lazy = Reference::of(&fleet, Secs::MAX / 4);
        lazy.expire(final_time(&fleet), &fleet.params.rules);
        let billed_of = |r: &Reference| {
            r.sessions
                .iter()
                .map(|(k, s)| (k.clone(), s.billed.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            billed_of(&reference),
            billed_of(&lazy),
            "{}",
            replay_hint(seed)
        );
        // Same seed, same ledger.
        let again = reference_of(&sim::generate(seed, &Params::acceptance()));
        let totals = |r: &Reference| {
            r.sessions
                .iter()
                .map(|(k, s)| (k.clone(), s.billed.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(totals(&reference), totals(&again), "{}", replay_hint(seed));
    }
}

/// A moment after everything: every silent session has been booked by then.
fn final_time(fleet: &Fleet) -> Secs {
    fleet.params.start + fleet.params.duration + 86_400
}

/// The reference ledger once the last expiry has run.
fn reference_of(fleet: &Fleet) -> Reference {
    let mut r = Reference::of(fleet, EXPIRE_EVERY);
    r.expire(final_time(fleet), &fleet.params.rules);
    r
}

/// How each org is funded past its plan, by its number: Free with nothing past it; Free
/// with grants of every kind (one ending mid-run, one starting mid-run, and a top-up
/// bought mid-run, `TOPUP_AT`); Pro paying as it goes up to a 5.00 cap after a grant; Pro
/// with nothing past it.
fn funding_of(o: usize, start: Secs) -> (&'static str, Option<&'static str>, Vec<Grant>) {
    let grant =
        |id: &str, kind: GrantKind, hours: i64, priority: i64, from: Secs, until: Option<Secs>| {
            Grant {
                org_id: sim::org_name(o),
                grant_id: format!("grt_{id}_{o}"),
                kind,
                seconds: hours * 3600,
                used_seconds: 0,
                priority,
                starts_at: from,
                expires_at: until,
                note: None,
                idempotency_key: None,
                created_at: start,
                voided_at: None,
                used_up_at: None,
            }
        };
    match o % 4 {
        1 => (
            "free",
            None,
            vec![
                grant("promo", GrantKind::Promo, 1, 10, start, None),
                grant(
                    "make_good",
                    GrantKind::MakeGood,
                    2,
                    10,
                    start,
                    Some(start + 36 * 3600),
                ),
                grant("trial", GrantKind::Trial, 2, 50, start + 86_400, None),
            ],
        ),
        2 => (
            "pro",
            Some("5.00"),
            vec![grant("promo", GrantKind::Promo, 1, 50, start, None)],
        ),
        3 => ("pro", None, vec![]),
        _ => ("free", None, vec![]),
    }
}

/// When the orgs with grants buy a 2-hour top-up, in simulated time after the start.
const TOPUP_AT: Secs = 36 * 3600 + 1800;

fn topup(o: usize, at: Secs) -> Grant {
    Grant {
        org_id: sim::org_name(o),
        grant_id: format!("grt_topup_{o}"),
        kind: GrantKind::Purchased,
        seconds: 2 * 3600,
        used_seconds: 0,
        priority: 50,
        starts_at: at,
        expires_at: Some(at + 365 * 86_400),
        note: None,
        idempotency_key: Some(format!("cs_sim_{o}")),
        created_at: at,
        voided_at: None,
        used_up_at: None,
    }
}

/// Feed a fleet to the store as the service would: every request delivered in the same
/// second committed together, the expiry job every `EXPIRE_EVERY` seconds.
/// Who the replay says made its changes.
fn actor() -> Actor {
    Actor::system("simulation")
}

/// A change the replay made: its org, action and subject, as the audit log must list it.
type Made = (String, Action, String);

/// A limit the replay sets, changes and removes on some orgs (never tight enough to
/// matter: the replay admits nothing, and the audit log is what it checks).
fn sim_limit(o: usize, weekly: Option<&str>) -> Limit {
    Limit {
        org_id: sim::org_name(o),
        kind: LimitKind::Project,
        member_id: "everything".into(),
        monthly_hours: Some("100000".parse().unwrap()),
        weekly_hours: weekly.map(|w| w.parse().unwrap()),
        created_at: 0,
        updated_at: 0,
    }
}

async fn replay_into(db: &Db, fleet: &Fleet) -> Vec<Made> {
    let rules = fleet.params.rules;
    let plans = common::plans();
    let start = fleet.params.start;
    let mut made: Vec<Made> = Vec::new();
    for o in 0..fleet.params.orgs {
        let org = sim::org_name(o);
        made.push((org.clone(), Action::OrgCreated, org.clone()));
        let (plan, cap, grants) = funding_of(o, start);
        db.upsert_org(
            &OrgUpsert {
                org_id: sim::org_name(o),
                plan_id: Some(plan.into()),
                plan_version: None,
                ..Default::default()
            },
            start,
            &actor(),
        )
        .await
        .unwrap();
        if let Some(cap) = cap {
            let overage = Overage {
                enabled: true,
                monthly_cap: cap.parse().unwrap(),
            };
            db.set_overage(&sim::org_name(o), &overage, start, &actor())
                .await
                .unwrap();
            made.push((org.clone(), Action::OverageUpdated, "overage".into()));
        }
        for g in grants {
            db.create_grant(&g, &actor()).await.unwrap().unwrap();
            made.push((
                org.clone(),
                Action::GrantCreated,
                format!("grant:{}", g.grant_id),
            ));
        }
        if o % 4 == 3 {
            db.put_limit(&sim_limit(o, None), start, &actor())
                .await
                .unwrap();
            made.push((
                org.clone(),
                Action::LimitSet,
                "limit:project:everything".into(),
            ));
        }
    }
    let mut topups_due = true;
    let mut next_expiry = fleet.params.start + EXPIRE_EVERY;
    let mut i = 0;
    while i < fleet.deliveries.len() {
        let at = fleet.deliveries[i].at();
        if topups_due && at >= start + TOPUP_AT {
            for o in (0..fleet.params.orgs).filter(|o| o % 4 == 1) {
                db.create_grant(&topup(o, at), &actor())
                    .await
                    .unwrap()
                    .unwrap();
                // The same checkout told twice grants once, and is one change.
                let again = db.create_grant(&topup(o, at), &actor()).await.unwrap();
                assert_eq!(again.map(|(_, created)| created), Some(false));
                made.push((
                    sim::org_name(o),
                    Action::GrantCreated,
                    format!("grant:grt_topup_{o}"),
                ));
            }
            for o in (0..fleet.params.orgs).filter(|o| o % 4 == 3) {
                let limit = sim_limit(o, Some("5000"));
                db.put_limit(&limit, at, &actor()).await.unwrap();
                // Setting what is there is no change.
                db.put_limit(&limit, at, &actor()).await.unwrap();
                made.push((
                    sim::org_name(o),
                    Action::LimitSet,
                    "limit:project:everything".into(),
                ));
            }
            topups_due = false;
        }
        while next_expiry <= at {
            db.expire_sessions(next_expiry, &rules, &plans, 100_000)
                .await
                .unwrap();
            next_expiry += EXPIRE_EVERY;
        }
        let mut group: Vec<Vec<Heartbeat>> = Vec::new();
        while i < fleet.deliveries.len() && fleet.deliveries[i].at() == at {
            match &fleet.deliveries[i] {
                Delivery::Batch { beats, .. } => group.push(
                    beats
                        .iter()
                        .map(|b| Heartbeat {
                            org_id: rush_meter_core::ids::Id::parse(&b.org).unwrap(),
                            session_id: rush_meter_core::ids::Id::parse(&b.session).unwrap(),
                            vm_id: rush_meter_core::ids::Id::parse(&b.vm).unwrap(),
                            obs: sim::observation(b, at, &rules),
                            received_at: at,
                        })
                        .collect(),
                ),
                Delivery::End {
                    org,
                    session,
                    status,
                    ..
                } => {
                    if !group.is_empty() {
                        let results = db.ingest(&group, &rules, &plans, at, 1).await.unwrap();
                        assert!(results.iter().all(Result::is_ok));
                        group.clear();
                    }
                    db.end_session(org, session, *status, at, &rules, &plans)
                        .await
                        .unwrap();
                }
            }
            i += 1;
        }
        if !group.is_empty() {
            let results = db.ingest(&group, &rules, &plans, at, 1).await.unwrap();
            assert!(results.iter().all(Result::is_ok));
        }
    }
    db.expire_sessions(final_time(fleet), &rules, &plans, 100_000)
        .await
        .unwrap();
    for o in (0..fleet.params.orgs).filter(|o| o % 4 == 3) {
        let (org, kind) = (sim::org_name(o), LimitKind::Project);
        let end = final_time(fleet);
        db.delete_limit(&org, kind, "everything", end, &actor())
            .await
            .unwrap()
            .unwrap();
        // Nothing left to remove: no change.
        assert_eq!(
            db.delete_limit(&org, kind, "everything", end, &actor())
                .await
                .unwrap(),
            None
        );
        made.push((org, Action::LimitRemoved, "limit:project:everything".into()));
    }
    made
}

/// The audit log of every org lists exactly the changes the replay made, in order, each
/// by the replay's actor.
async fn check_audit(seed: u64, db: &Db, fleet: &Fleet, made: &[Made]) {
    for o in 0..fleet.params.orgs {
        let org = sim::org_name(o);
        let logged = db.list_audit(&org, 0, i64::MAX, None, 1000).await.unwrap();
        assert!(
            logged.iter().all(|e| e.actor == actor()),
            "{}",
            replay_hint(seed)
        );
        let got: Vec<Made> = logged
            .into_iter()
            .map(|e| (e.org_id, e.action, e.subject))
            .collect();
        let want: Vec<Made> = made.iter().filter(|m| m.0 == org).cloned().collect();
        assert_eq!(got, want, "{}: the audit log of {org}", replay_hint(seed));
    }
}

/// Merge touching intervals, so booked pieces compare with stored spans.
fn merged(mut v: Vec<Interval>) -> Vec<Interval> {
    v.sort();
    let mut out: Vec<Interval> = Vec::new();
    for x in v {
        match out.last_mut() {
            Some(last) if last.end >= x.start => last.end = last.end.max(x.end),
            _ => out.push(x),
        }
    }
    out
}

/// The store must hold exactly the reference ledger: per session, per org-hour, per span.
async fn check_store(seed: u64, db: &Db, fleet: &Fleet, reference: &Reference) {
    let hint = replay_hint(seed);
    let mut by_org: BTreeMap<String, Vec<&sim::RefSession>> = BTreeMap::new();
    for s in reference.sessions.values() {
        by_org.entry(s.org.clone()).or_default().push(s);
    }
    for o in 0..fleet.params.orgs {
        let org = sim::org_name(o);
        let refs = by_org.remove(&org).unwrap_or_default();
        let stored = db.sessions_of_org(&org).await.unwrap();
        let want: BTreeMap<String, i64> = reference
            .sessions
            .iter()
            .filter(|(_, s)| s.org == org)
            .map(|(k, s)| (k.clone(), s.ledger.billed_seconds))
            .collect();
        let got: BTreeMap<String, i64> = stored
            .iter()
            .map(|s| (s.session_id.clone(), s.ledger.billed_seconds))
            .collect();
        assert_eq!(
            got, want,
            "{hint}: {org} per-session billing differs from the reference"
        );
        let billed: i64 = want.values().sum();
        let hourly: i64 = db
            .hourly_totals(&org)
            .await
            .unwrap()
            .iter()
            .map(|h| h.1)
            .sum();
        assert_eq!(
            hourly, billed,
            "{hint}: {org} hourly rollup differs from the ledger"
        );
        let per_session: BTreeMap<String, i64> = db
            .session_hourly_totals(&org)
            .await
            .unwrap()
            .into_iter()
            .collect();
        let want_nonzero: BTreeMap<String, i64> = want
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert_eq!(
            per_session, want_nonzero,
            "{hint}: {org} session rollup differs"
        );
        // Spans: the stored running spans are the booked pieces, merged.
        let mut spans: BTreeMap<String, Vec<Interval>> = BTreeMap::new();
        for (sid, a, b) in db.running_spans(&org).await.unwrap() {
            spans.entry(sid).or_default().extend(Interval::new(a, b));
        }
        for (sid, s) in reference.sessions.iter().filter(|(_, s)| s.org == org) {
            let got = merged(spans.remove(sid).unwrap_or_default());
            assert_eq!(got, merged(s.billed.clone()), "{hint}: spans of {sid}");
        }
        // The org's window totals (week of 30 Nov, month of December) read the same.
        let week = rush_meter_core::time::iso_week(1_796_040_000);
        let month = rush_meter_core::time::calendar_month(1_796_169_600);
        let used = db
            .window_usage(
                &[&org],
                &rush_meter_core::time::Windows { month, week },
                final_time(fleet),
                &fleet.params.rules,
            )
            .await
            .unwrap()
            .get(&org)
            .map_or(vec![0, 0], |u| vec![u.month, u.week]);
        let clip = |w: Interval| -> i64 {
            refs.iter()
                .flat_map(|s| s.billed.iter())
                .filter_map(|b| b.clip(&w))
                .map(|c| c.len())
                .sum()
        };
        assert_eq!(
            used,
            vec![clip(month), clip(week)],
            "{hint}: {org} window totals"
        );
        // Every second of the member rollup is one of the org's, once in each dimension:
        // no member uses more than its org, which lets the gate skip the use of limits out
        // of reach of the org's (`Limit::within_reach`).
        for by in [GroupBy::Project, GroupBy::User, GroupBy::Agent] {
            let mut in_windows = Vec::new();
            for w in [month, week] {
                let pieces = db
                    .session_hour_pieces(&org, w.start, w.end, by)
                    .await
                    .unwrap();
                in_windows.push(pieces.iter().map(|p| p.seconds).sum::<i64>());
            }
            assert_eq!(in_windows, used, "{hint}: {org} member rollup by {by:?}");
        }
    }
}

/// Who paid, as the store holds it, against the reference ledger: each window's sources
/// add up to what the ledger billed in it; the plan pays up to its ceilings, grants up to
/// what they hold, pay-as-you-go up to its cap in money; what grants paid is what they say
/// they were used for.
async fn check_funding(seed: u64, db: &Db, fleet: &Fleet, reference: &Reference) {
    let hint = replay_hint(seed);
    let plans = common::plans();
    let mut sources = [0i64; 4];
    for o in 0..fleet.params.orgs {
        let org = sim::org_name(o);
        let (plan, cap, _) = funding_of(o, fleet.params.start);
        let plan = plans.get(plan).unwrap();
        let billed: Vec<&Interval> = reference
            .sessions
            .values()
            .filter(|s| s.org == org)
            .flat_map(|s| s.billed.iter())
            .collect();
        let windows = db.funding_windows_of(&org).await.unwrap();
        assert!(!windows.is_empty(), "{hint}: {org} funded nothing");
        let mut grant_seconds = 0;
        for w in &windows {
            let want: i64 = billed
                .iter()
                .filter_map(|b| b.clip(&w.window))
                .map(|c| c.len())
                .sum();
            assert_eq!(
                w.funds.total(),
                want,
                "{hint}: {org} {:?} {:?} sources against the ledger",
                w.kind,
                w.window
            );
            let limit = match w.kind {
                WindowKind::Month => plan.monthly_limit_seconds,
                WindowKind::Week => plan.weekly_limit_seconds,
            };
            assert!(
                w.funds.plan <= limit,
                "{hint}: {org} plan paid {} s past {limit}",
                w.funds.plan
            );
            if w.kind == WindowKind::Month {
                grant_seconds += w.funds.grant;
                for (i, s) in [w.funds.plan, w.funds.grant, w.funds.overage, w.funds.grace]
                    .iter()
                    .enumerate()
                {
                    sources[i] += s;
                }
                let cap = cap.map_or(rust_decimal::Decimal::ZERO, |c| c.parse().unwrap());
                assert!(
                    w.funds.overage_amount() <= cap,
                    "{hint}: {org} paid {} past its cap {cap}",
                    w.funds.overage_amount()
                );
                if cap.is_zero() {
                    assert_eq!(
                        w.funds.overage, 0,
                        "{hint}: {org} paid as it went without pay-as-you-go"
                    );
                }
            }
        }
        let grants = db.list_grants(&org).await.unwrap();
        for g in &grants {
            assert!(
                g.used_seconds <= g.seconds,
                "{hint}: {org} {} used past what it holds",
                g.grant_id
            );
        }
        let used: i64 = grants.iter().map(|g| g.used_seconds).sum();
        assert_eq!(
            used, grant_seconds,
            "{hint}: {org} grants' use against the windows' grant seconds"
        );
    }
    eprintln!(
        "seed {seed}: plan {} s, grants {} s, pay-as-you-go {} s, grace {} s",
        sources[0], sources[1], sources[2], sources[3]
    );
    assert!(
        sources.iter().all(|s| *s > 0),
        "{hint}: the fleet exercises every source: {sources:?}"
    );
}

/// Seconds of `billed` inside `w`.
fn clipped(billed: &[Interval], w: Interval) -> i64 {
    billed
        .iter()
        .filter_map(|b| b.clip(&w))
        .map(|c| c.len())
        .sum()
}

/// Every reader of a replayed fleet, served over HTTP, against the reference: the usage
/// page, the breakdown by every grouping, and both exports of November and December
/// (live, then November closed). Returns every export's bytes.
async fn check_readers(
    srv: &common::TestServer,
    seed: u64,
    fleet: &Fleet,
    reference: &Reference,
) -> Vec<String> {
    let hint = replay_hint(seed);
    let mut bodies = Vec::new();
    let months =
        ["2026-11", "2026-12"].map(|m| (m, rush_meter_core::export::parse_month(m).unwrap()));
    for (name, month) in months {
        let (from, to) = (
            rush_meter_core::time::format_rfc3339(month.start),
            rush_meter_core::time::format_rfc3339(month.end),
        );
        for o in 0..fleet.params.orgs {
            let org = sim::org_name(o);
            let sessions: Vec<(&String, &sim::RefSession)> = reference
                .sessions
                .iter()
                .filter(|(_, s)| s.org == org)
                .collect();
            let want_total: i64 = sessions
                .iter()
                .map(|(_, s)| clipped(&s.billed, month))
                .sum();
            for g in [
                "hour", "day", "session", "project", "user", "agent", "funding",
            ] {
                let v = srv
                    .admin(
                        "GET",
                        &format!("/v1/orgs/{org}/usage/breakdown?group_by={g}&from={from}&to={to}"),
                        None,
                    )
                    .await;
                let rows = v["rows"].as_array().unwrap();
                let sum: i64 = rows.iter().map(|r| r["seconds"].as_i64().unwrap()).sum();
                assert_eq!(sum, want_total, "{hint}: {org} {name} by {g}");
                if g == "session" {
                    let got: BTreeMap<String, i64> = rows
                        .iter()
                        .map(|r| {
                            (
                                r["key"].as_str().unwrap().to_owned(),
                                r["seconds"].as_i64().unwrap(),
                            )
                        })
                        .collect();
                    let want: BTreeMap<String, i64> = sessions
                        .iter()
                        .map(|(k, s)| ((*k).clone(), clipped(&s.billed, month)))
                        .filter(|(_, v)| *v > 0)
                        .collect();
                    assert_eq!(got, want, "{hint}: {org} {name} by session");
                }
                if g == "hour" {
                    for r in rows {
                        let h = rush_meter_core::time::rfc3339::parse(r["key"].as_str().unwrap())
                            .unwrap();
                        let hour = Interval::new(h, h + 3600).unwrap();
                        let want: i64 =
                            sessions.iter().map(|(_, s)| clipped(&s.billed, hour)).sum();
                        assert_eq!(
                            r["seconds"].as_i64().unwrap(),
                            want,
                            "{hint}: {org} hour {h}"
                        );
                    }
                }
            }
        }
        let mut per_session: BTreeMap<String, i64> = BTreeMap::new();
        let mut per_org: BTreeMap<String, i64> = BTreeMap::new();
        for format in ["csv", "jsonl"] {
            for by in ["org", "session"] {
                let (status, _, body) = srv
                    .get_text(
                        &format!("/v1/exports/usage?period={name}&by={by}&format={format}"),
                        "x",
                    )
                    .await;
                assert_eq!(status, 200, "{body}");
                if format == "jsonl" {
                    for line in body.lines() {
                        let v: serde_json::Value = serde_json::from_str(line).unwrap();
                        if by == "org" {
                            per_org.insert(
                                v["org_id"].as_str().unwrap().into(),
                                v["agent_seconds"].as_i64().unwrap(),
                            );
                        } else {
                            *per_org
                                .entry(format!("sum:{}", v["org_id"].as_str().unwrap()))
                                .or_default() += v["running_seconds"].as_i64().unwrap();
                            per_session.insert(
                                v["session_id"].as_str().unwrap().into(),
                                v["running_seconds"].as_i64().unwrap(),
                            );
                        }
                    }
                }
                bodies.push(body);
            }
        }
        for o in 0..fleet.params.orgs {
            let org = sim::org_name(o);
            let want: i64 = reference
                .sessions
                .values()
                .filter(|s| s.org == org)
                .map(|s| clipped(&s.billed, month))
                .sum();
            assert_eq!(
                per_org.get(&org).copied(),
                Some(want),
                "{hint}: {org} {name} org export"
            );
            assert_eq!(
                per_org.get(&format!("sum:{org}")).copied().unwrap_or(0),
                want,
                "{hint}: {org} {name} session export"
            );
        }
        for (sid, s) in &reference.sessions {
            let want = clipped(&s.billed, month);
            if want > 0 {
                assert_eq!(
                    per_session.get(sid).copied(),
                    Some(want),
                    "{hint}: {sid} {name} session export"
                );
            }
        }
    }
    // The usage page (December, and the week of 30 November) reads the same.
    for o in 0..fleet.params.orgs {
        let org = sim::org_name(o);
        let usage = srv.usage(&org).await;
        let billed: Vec<&Vec<Interval>> = reference
            .sessions
            .values()
            .filter(|s| s.org == org)
            .map(|s| &s.billed)
            .collect();
        let month = months[1].1;
        let want: i64 = billed.iter().map(|b| clipped(b, month)).sum();
        assert_eq!(
            usage["month"]["used_seconds"].as_i64(),
            Some(want),
            "{hint}: {org} usage page"
        );
        // Who paid, the same on the usage page, the breakdown and the export.
        let (from, to) = (
            rush_meter_core::time::format_rfc3339(month.start),
            rush_meter_core::time::format_rfc3339(month.end),
        );
        let b = srv
            .admin(
                "GET",
                &format!("/v1/orgs/{org}/usage/breakdown?group_by=funding&from={from}&to={to}"),
                None,
            )
            .await;
        let row = |k: &str| {
            b["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["key"] == k)
                .map_or(0, |r| r["seconds"].as_i64().unwrap())
        };
        let (_, _, export) = srv
            .get_text("/v1/exports/usage?period=2026-12&by=org&format=jsonl", "x")
            .await;
        let line: serde_json::Value = export
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["org_id"] == org.as_str())
            .unwrap();
        for (source, page, column) in [
            ("plan", "plan_seconds", "plan_seconds"),
            ("grant", "grant_seconds", "grant_seconds"),
            ("overage", "overage_seconds", "overage_seconds"),
            ("grace", "grace_seconds", "grace_seconds"),
        ] {
            let p = usage["month"][page].as_i64().unwrap();
            assert_eq!(
                p,
                row(source),
                "{hint}: {org} {source}: usage page against breakdown"
            );
            assert_eq!(
                line[column].as_i64(),
                Some(p),
                "{hint}: {org} {source}: usage page against export"
            );
        }
        assert_eq!(
            usage["month"]["overage_amount"], line["overage_amount"],
            "{hint}: {org} overage amount"
        );
    }
    // Closing November changes none of its bytes.
    srv.admin("POST", "/v1/periods/2026-11/close", None).await;
    for (i, (format, by)) in [
        ("csv", "org"),
        ("csv", "session"),
        ("jsonl", "org"),
        ("jsonl", "session"),
    ]
    .into_iter()
    .enumerate()
    {
        let (_, state, body) = srv
            .get_text(
                &format!("/v1/exports/usage?period=2026-11&by={by}&format={format}"),
                "rush-period-state",
            )
            .await;
        assert_eq!(state.as_deref(), Some("closed"));
        assert_eq!(body, bodies[i], "{hint}: closed November {by} {format}");
    }
    bodies
}

/// The fleet the readers are checked on: the acceptance fleet, or on a Citus cluster
/// (`RUSH_METER_TEST_CITUS`), where each of the replay's transactions goes through the
/// coordinator and the whole fleet would take most of CI's time, its first four orgs (one
/// of each funding, `funding_of`) with as many sessions each, their hosts flushing every
/// 30 s rather than 5 (still within a lease, so that Pro's pay-as-you-go is reached: the
/// fleet exercises every funding source). The same fleet runs on SQLite, so the two still
/// compare byte for byte.
fn readers_params() -> Params {
    let full = Params::acceptance();
    match common::citus::coordinator() {
        Some(_) => Params {
            orgs: 4,
            sessions: full.sessions * 4 / full.orgs,
            flush: 30,
            ..full
        },
        None => full,
    }
}

/// Replay the fleet into a fresh database of `backend`, check the store and every reader,
/// and return the exports' bytes; `None` when the backend is not available here.
async fn readers_on(backend: Backend, seed: u64) -> Option<(Vec<(String, i64, i64)>, Vec<String>)> {
    let fleet = sim::generate(seed, &readers_params());
    let reference = reference_of(&fleet);
    let (url, dir) = fresh_database(backend).await?;
    let db = Db::connect(&url, Default::default()).await.unwrap();
    db.migrate().await.unwrap();
    let started = std::time::Instant::now();
    let made = replay_into(&db, &fleet).await;
    eprintln!(
        "{backend:?}: replayed {} deliveries in {:?}",
        fleet.deliveries.len(),
        started.elapsed()
    );
    check_store(seed, &db, &fleet, &reference).await;
    check_funding(seed, &db, &fleet, &reference).await;
    check_audit(seed, &db, &fleet, &made).await;
    let digest = db.digest().await.unwrap();
    db.close().await;
    let srv = common::TestServer::start_on(
        backend,
        url,
        dir,
        common::Options {
            clock_start: final_time(&fleet),
            ..common::Options::default()
        },
    )
    .await;
    let started = std::time::Instant::now();
    let bodies = check_readers(&srv, seed, &fleet, &reference).await;
    eprintln!(
        "{backend:?}: every reader checked in {:?}",
        started.elapsed()
    );
    Some((digest, bodies))
}

/// The store keeps the reference ledger on both backends (per session, per hour, per
/// span, per window), and usage page, breakdown by every grouping, both exports and the
/// ledger agree to the second for a random fleet; the two backends hold the same ledger
/// (table digests) and write byte-identical exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reader_agrees_with_the_ledger_on_both_backends() {
    let seed = seeds()[0];
    let (digest, sqlite) = readers_on(Backend::Sqlite, seed)
        .await
        .expect("SQLite is always here");
    if let Some((pg_digest, pg)) = readers_on(Backend::Postgres, seed).await {
        assert_eq!(
            pg_digest,
            digest,
            "{}: the backends' ledgers differ",
            replay_hint(seed)
        );
        assert_eq!(pg.len(), sqlite.len());
        for (i, (a, b)) in pg.iter().zip(&sqlite).enumerate() {
            assert!(
                a == b,
                "{}: export {i} differs between PostgreSQL and SQLite",
                replay_hint(seed)
            );
        }
    }
}
