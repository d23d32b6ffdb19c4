//! How cost grows with history: four databases of 10⁴, 10⁵, 10⁶ and 10⁷
//! heartbeats of history (and 10 to 100,000 orgs), each with the same present, and on each
//! a decision, a heartbeat, the usage page and a breakdown, timed over HTTP. Writes
//! reports/growth.md and reports/growth.png.
//!
//! Run: `cargo bench --bench growth` (PostgreSQL on 127.0.0.1:5432, or RUSH_METER_TEST_PG);
//! `-- sqlite 2` builds one backend's two smallest sizes only and prints, writing nothing.

mod common;

use std::time::{Duration, Instant};

use common::{harness, Backend, Options, Server, ADMIN};
use rush_meter::store::{Db, Pools};
use rush_meter_core::gate::{AdmissionRequest, Agent};
use rush_meter_core::heartbeats::Heartbeat;
use rush_meter_core::ids::Id;
use rush_meter_core::ledger::{Observation, Rules, VmState};
use rush_meter_core::plans::Plans;
use rush_meter_core::time::Secs;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DAY: Secs = 86_400;
/// 2026-12-01T00:00:00Z.
const DEC: Secs = 1_796_083_200;
/// Tuesday 8 December 2026, 12:00 UTC: the present of every size. Its ISO week starts on
/// Monday the 7th and its month on the 1st, so that neither window holds any of the
/// history, which all lies in November.
const NOW: Secs = DEC + 7 * DAY + 12 * 3600;
/// The last burst of history starts two hours before December (it parks an hour later).
const PAST_LAST: Secs = DEC - 2 * 3600;
const RULES: Rules = Rules {
    interval: 15,
    lease: 45,
};
/// Every 10 minutes ten sessions start; each runs an hour, beating every 15 s, and parks
/// (241 heartbeats, the last one parked), and stays parked: sixty run at a time.
const BURST_EVERY: Secs = 600;
const BURST: usize = 10;
const SESSION_RUNS: Secs = 3600;
const BEATS_PER_SESSION: u64 = (SESSION_RUNS / 15 + 1) as u64;
/// The present: five sessions of the measured org started 50, 40, 30, 20 and 10 minutes
/// before `NOW`, running still.
const PRESENT: [Secs; 5] = [3000, 2400, 1800, 1200, 600];
/// The measured org's keys: its sessions take them in turn.
const KEYS: usize = 100;
/// Timed rounds, the sizes interleaved in each, so that the machine's drift falls on all
/// of them alike; a size's figure is the median of its rounds' medians.
const ROUNDS: usize = 10;
const REQUESTS: usize = 100;

#[derive(Clone, Copy)]
struct Size {
    heartbeats: u64,
    orgs: u64,
}

/// Heartbeats ×10 a step; orgs ×21.5 a step (10^(1 + 4k/3)), from 10 to 100,000.
const SIZES: [Size; 4] = [
    Size {
        heartbeats: 10_000,
        orgs: 10,
    },
    Size {
        heartbeats: 100_000,
        orgs: 215,
    },
    Size {
        heartbeats: 1_000_000,
        orgs: 4_642,
    },
    Size {
        heartbeats: 10_000_000,
        orgs: 100_000,
    },
];

/// The org every figure is measured on (a Team org with a grant large enough for a
/// month of six sessions at a time); the others' ids are `g0`, `g1`, …
const ORG: &str = "bench";

/// One session of the history or the present: who starts it, when.
struct Session {
    org: String,
    key: String,
    id: String,
    start: Secs,
    n: usize,
}

impl Session {
    fn admission(&self) -> AdmissionRequest {
        AdmissionRequest {
            org_id: self.org.clone(),
            key_id: self.key.clone(),
            session_id: self.id.clone(),
            agent: [Agent::Claude, Agent::Codex, Agent::Opencode][self.n % 3],
            project_id: Some(format!("p{}", self.n % 7)),
            started_by: Some(format!("u{}", self.n % 20)),
        }
    }

    /// Its heartbeat at `at`, if it beats then.
    fn beat(&self, at: Secs) -> Option<Heartbeat> {
        if at < self.start || at > self.start + SESSION_RUNS {
            return None;
        }
        let id = Id::parse(&self.id).unwrap();
        Some(Heartbeat {
            org_id: Id::parse(&self.org).unwrap(),
            session_id: id.clone(),
            vm_id: id,
            obs: Observation {
                seq: (at - self.start) / 15 + 1,
                at,
                state: if at < self.start + SESSION_RUNS {
                    VmState::Running
                } else {
                    VmState::Parked
                },
            },
            received_at: at,
        })
    }
}

/// The heartbeats the present's sessions have sent by `NOW`.
fn present_beats() -> u64 {
    PRESENT.iter().map(|ago| (ago / 15 + 1) as u64).sum()
}

/// Every session of `size`, by start: bursts of ten ending two hours before December (one
/// session of each burst the measured org's, nine spread over the other orgs in turn),
/// then the present.
fn schedule(size: Size) -> Vec<Session> {
    let past = ((size.heartbeats - present_beats()) / BEATS_PER_SESSION) as usize;
    let bursts = past.div_ceil(BURST) as Secs;
    let others = size.orgs as usize - 1;
    let first = PAST_LAST - (bursts - 1) * BURST_EVERY;
    let mut out = Vec::with_capacity(past + PRESENT.len());
    let (mut mine, mut theirs) = (0, 0);
    for i in 0..past {
        let start = first + (i / BURST) as Secs * BURST_EVERY;
        if i % BURST == 0 {
            out.push(measured_session(mine, start));
            mine += 1;
        } else {
            out.push(Session {
                org: format!("g{}", theirs % others),
                key: "k1".into(),
                id: format!("b{theirs}"),
                start,
                n: theirs,
            });
            theirs += 1;
        }
    }
    for ago in PRESENT {
        out.push(measured_session(mine, NOW - ago));
        mine += 1;
    }
    out
}

fn measured_session(n: usize, start: Secs) -> Session {
    Session {
        org: ORG.into(),
        key: format!("k{}", n % KEYS),
        id: format!("s{n}"),
        start,
        n,
    }
}

async fn fetch_i64(db: &Db, sql: &str) -> i64 {
    match db.pools() {
        Pools::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        Pools::Sqlite { read, .. } => sqlx::query_scalar(sql).fetch_one(read).await,
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The orgs and their keys, written with SQL (10⁵ orgs through the API would take longer
/// than the history): the other orgs on the Team plan with one key of the plan's
/// concurrency, the measured org with `KEYS` keys of 100.
async fn seed_orgs(db: &Db, size: Size, from: Secs) {
    let others = size.orgs - 1;
    let series = |n: u64| {
        format!("WITH RECURSIVE g(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM g WHERE x < {n})")
    };
    let statements = [
        format!(
            "INSERT INTO orgs (org_id, name, plan_id, suspended, created_at, updated_at) \
             VALUES ('{ORG}', '{ORG}', 'team', FALSE, {from}, {from})"
        ),
        format!(
            "{} INSERT INTO orgs (org_id, name, plan_id, suspended, created_at, updated_at) \
             SELECT 'g' || x, 'org ' || x, 'team', FALSE, {from}, {from} FROM g",
            series(others - 1)
        ),
        format!(
            "{} INSERT INTO api_keys (org_id, key_id, concurrency_limit, created_at, updated_at) \
             SELECT 'g' || x, 'k1', NULL, {from}, {from} FROM g",
            series(others - 1)
        ),
        format!(
            "{} INSERT INTO api_keys (org_id, key_id, concurrency_limit, created_at, updated_at) \
             SELECT '{ORG}', 'k' || x, 100, {from}, {from} FROM g",
            series(KEYS as u64 - 1)
        ),
    ];
    for sql in statements {
        common::execute(db, &sql).await;
    }
}

/// Feed `sessions` through the store as the service would see them, in time order: each
/// burst admitted through the gate when it starts, then its ten minutes of heartbeats in
/// one group commit (a request a 15-s step). Returns the heartbeats sent.
async fn seed_history(db: &Db, sessions: &[Session]) -> u64 {
    let plans = harness::plans();
    let mut sent = 0;
    let mut t = sessions[0].start;
    while t <= NOW {
        // Sessions that beat in [t, t + 10 min): started within the hour before it.
        let lo = sessions.partition_point(|s| s.start < t - SESSION_RUNS);
        let hi = sessions.partition_point(|s| s.start < t + BURST_EVERY);
        if lo == hi {
            // A gap in the history (the week before the present): go to the next start.
            t = sessions[hi].start;
            continue;
        }
        let starting: Vec<AdmissionRequest> = sessions[lo..hi]
            .iter()
            .filter(|s| s.start == t)
            .map(Session::admission)
            .collect();
        if !starting.is_empty() {
            for d in db.admit(&plans, &starting, t, &RULES).await.unwrap() {
                let d = d.expect("the org and key exist");
                assert_eq!(d.decision, "allow", "{d:?}");
            }
        }
        let mut group = Vec::new();
        let mut at = t;
        while at < t + BURST_EVERY && at <= NOW {
            let beats: Vec<Heartbeat> =
                sessions[lo..hi].iter().filter_map(|s| s.beat(at)).collect();
            sent += beats.len() as u64;
            if !beats.is_empty() {
                group.push(beats);
            }
            at += 15;
        }
        if !group.is_empty() {
            db.ingest(&group, &RULES, &plans, at - 15, 0).await.unwrap();
        }
        if t % 3600 == 0 {
            expire(db, &plans, t).await;
        }
        t += BURST_EVERY;
    }
    expire(db, &plans, NOW).await;
    sent
}

/// What the service's expiry job does every few seconds (src/app/jobs.rs), caught up to
/// `now`: sessions parked for a week end (`PARKED_EXPIRY_SECS`), so an org's parked
/// sessions are at most a week's.
async fn expire(db: &Db, plans: &Plans, now: Secs) {
    while db.expire_sessions(now, &RULES, plans, 1000).await.unwrap() > 0 {}
}

/// A size's database, seeded, and the service on it at `NOW`.
struct Built {
    size: Size,
    server: Server,
    sent: u64,
    sessions: i64,
    spans: i64,
    bytes: i64,
    seeded_in: Duration,
    /// The present's sessions and the next sequence number of each.
    running: Vec<(String, i64)>,
}

fn options(clock_start: Secs) -> Options {
    Options {
        clock_start,
        ..common::bench_options()
    }
}

async fn build(backend: Backend, size: Size) -> Built {
    let sessions = schedule(size);
    let from = sessions[0].start;
    // Seeded without waiting for fsync (hours of history in minutes); measured durable.
    let (url, dir) = harness::fresh_database_with(backend, false)
        .await
        .expect("PostgreSQL for the benchmark");
    let server = Server::start_on(backend, url, dir, options(from)).await;
    let started = Instant::now();
    seed_orgs(&server.db, size, from).await;
    server
        .admin(
            "POST",
            &format!("/v1/orgs/{ORG}/grants"),
            Some(serde_json::json!({"seconds": 20_000_000, "kind": "promo"})),
        )
        .await;
    let sent = seed_history(&server.db, &sessions).await;
    assert_eq!(
        sent,
        sessions.len() as u64 * BEATS_PER_SESSION - PRESENT.len() as u64 * BEATS_PER_SESSION
            + present_beats()
    );
    if let Pools::Postgres(p) = server.db.pools() {
        for sql in [
            "VACUUM ANALYZE".to_owned(),
            format!(
                "ALTER DATABASE {} RESET synchronous_commit",
                server.database_url.rsplit('/').next().unwrap()
            ),
        ] {
            sqlx::query(&sql).execute(p).await.unwrap();
        }
    }
    let seeded_in = started.elapsed();
    server.clock.set(NOW);
    let server = server.restart(options(NOW)).await;
    let sessions_n = fetch_i64(&server.db, "SELECT COUNT(*) FROM sessions").await;
    let spans = fetch_i64(&server.db, "SELECT COUNT(*) FROM spans").await;
    let bytes = match server.db.pools() {
        Pools::Postgres(_) => {
            fetch_i64(&server.db, "SELECT pg_database_size(current_database())").await
        }
        Pools::Sqlite { .. } => {
            fetch_i64(
                &server.db,
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
            )
            .await
        }
    };
    let running = sessions[sessions.len() - PRESENT.len()..]
        .iter()
        .map(|s| (s.id.clone(), (NOW - s.start) / 15 + 2))
        .collect();
    eprintln!(
        "{backend:?}: {sent} heartbeats, {} orgs, {sessions_n} sessions in {seeded_in:?}",
        size.orgs
    );
    Built {
        size,
        server,
        sent,
        sessions: sessions_n,
        spans,
        bytes,
        seeded_in,
        running,
    }
}

/// What is timed on each size.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Decision,
    Heartbeat,
    UsagePage,
    Breakdown,
}

impl Op {
    const ALL: [Op; 4] = [Op::Decision, Op::Heartbeat, Op::UsagePage, Op::Breakdown];

    fn short(self) -> &'static str {
        match self {
            Op::Decision => "decision",
            Op::Heartbeat => "heartbeat",
            Op::UsagePage => "usage page",
            Op::Breakdown => "breakdown by project",
        }
    }
}

/// Issue one request of `op` on `b` (the `n`th of its kind) and check its answer.
async fn request(b: &mut Built, op: Op, n: usize) -> Duration {
    let s = &b.server;
    let (method, path, body) = match op {
        Op::Decision => (
            "POST",
            "/v1/admissions".to_owned(),
            Some(serde_json::json!({
                "org_id": ORG, "key_id": format!("k{}", n % KEYS), "session_id": format!("m{n}"),
                "agent": "codex", "project_id": format!("p{}", n % 7),
                "started_by": format!("u{}", n % 20),
            })),
        ),
        Op::Heartbeat => {
            let (id, seq) = &mut b.running[n % PRESENT.len()];
            let beat = harness::hb(ORG, id, *seq, "running", NOW);
            *seq += 1;
            (
                "POST",
                "/v1/heartbeats".to_owned(),
                Some(serde_json::json!({"heartbeats": [beat]})),
            )
        }
        Op::UsagePage => ("GET", format!("/v1/orgs/{ORG}/usage"), None),
        Op::Breakdown => (
            "GET",
            format!("/v1/orgs/{ORG}/usage/breakdown?group_by=project"),
            None,
        ),
    };
    let started = Instant::now();
    let (status, v) = s.call(method, &path, Some(ADMIN), body.as_ref()).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{path}: {v}");
    match op {
        Op::Decision => assert_eq!(v["decision"], "allow", "{v}"),
        Op::Heartbeat => assert_eq!(v["results"][0]["accepted"], true, "{v}"),
        _ => {}
    }
    took
}

/// A size's figures: per op, the median of each round's median, and the p99 of all.
struct Figures {
    p50: [Duration; 4],
    p99: [Duration; 4],
}

/// Time every op on every size, `ROUNDS` rounds after a warm-up. Within a round each op's
/// requests go to the sizes in turn, one request each, the first size rotating from one
/// request to the next: a stall of the machine falls on every size alike, and no size is
/// always asked first.
async fn measure(built: &mut [Built]) -> Vec<Figures> {
    let sizes = built.len();
    let mut samples = vec![vec![Vec::new(); 4]; sizes];
    let mut round_p50 = vec![vec![Vec::new(); 4]; sizes];
    let mut n = 0;
    for round in 0..=ROUNDS {
        for (o, op) in Op::ALL.into_iter().enumerate() {
            let mut times = vec![Vec::with_capacity(REQUESTS); sizes];
            for r in 0..REQUESTS {
                for k in 0..sizes {
                    let i = (r + k) % sizes;
                    times[i].push(request(&mut built[i], op, n).await);
                    n += 1;
                }
            }
            if round == 0 {
                continue; // the warm-up
            }
            for (i, t) in times.into_iter().enumerate() {
                round_p50[i][o].push(common::percentiles(t.clone()).0);
                samples[i][o].extend(t);
            }
        }
    }
    (0..sizes)
        .map(|i| Figures {
            p50: std::array::from_fn(|o| common::percentiles(round_p50[i][o].clone()).0),
            p99: std::array::from_fn(|o| common::percentiles(samples[i][o].clone()).1),
        })
        .collect()
}

struct Grown {
    backend: Backend,
    built: Vec<Built>,
    figures: Vec<Figures>,
}

async fn grow(backend: Backend, sizes: &[Size]) -> Grown {
    let mut built = Vec::new();
    for size in sizes {
        built.push(build(backend, *size).await);
    }
    let figures = measure(&mut built).await;
    Grown {
        backend,
        built,
        figures,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A backend's table: the sizes as rows, each op's p50 (p99) in ms, and the growth from
/// the smallest size to the largest.
fn section(md: &mut String, g: &Grown) {
    md.push_str(&format!("### {:?}\n\n", g.backend));
    md.push_str("| heartbeats | orgs | sessions | spans | database | seeded in |");
    for op in Op::ALL {
        md.push_str(&format!(" {} p50 (p99), ms |", op.short()));
    }
    md.push_str("\n| --- | --- | --- | --- | --- | --- |");
    md.push_str(&" --- |".repeat(Op::ALL.len()));
    md.push('\n');
    for (b, f) in g.built.iter().zip(&g.figures) {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} MB | {:.0} s |",
            thousands(b.sent),
            thousands(b.size.orgs),
            thousands(b.sessions as u64),
            thousands(b.spans as u64),
            b.bytes as f64 / 1e6,
            b.seeded_in.as_secs_f64()
        ));
        for o in 0..Op::ALL.len() {
            md.push_str(&format!(" {} ({}) |", ms(f.p50[o]), ms(f.p99[o])));
        }
        md.push('\n');
    }
    md.push_str("| **largest ÷ smallest** | | | | | |");
    for o in 0..Op::ALL.len() {
        md.push_str(&format!(" **{:.2}** |", growth(g, o)));
    }
    md.push_str("\n\n");
}

/// An op's p50 at the largest size over its p50 at the smallest.
fn growth(g: &Grown, o: usize) -> f64 {
    let (first, last) = (&g.figures[0], g.figures.last().unwrap());
    last.p50[o].as_secs_f64() / first.p50[o].as_secs_f64()
}

/// reports/growth.png: a panel a backend, each op's p50 over its p50 at the smallest size,
/// against heartbeats of history (log scale), with the 1.2 line the issue sets.
fn plot(grown: &[Grown], path: &str) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    // ab_glyph draws text from a font the program hands it (no system font lookup, which
    // would link fontconfig and freetype): DejaVu Sans, from Debian's fonts-dejavu-core.
    const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
    let font = std::fs::read(FONT)
        .map_err(|e| format!("{FONT}: {e} (apt-get install fonts-dejavu-core)"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into()))
        .map_err(|_| format!("{FONT} is not a font plotters can read"))?;
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Cost against history: p50 at each size over p50 at the smallest (interleaved rounds)",
        ("sans-serif", 22),
    )?;
    let top = grown
        .iter()
        .flat_map(|g| {
            g.figures
                .iter()
                .flat_map(|f| f.p50.iter().zip(g.figures[0].p50))
        })
        .map(|(d, first)| d.as_secs_f64() / first.as_secs_f64())
        .fold(1.6f64, f64::max)
        * 1.1;
    let colors = [RED, BLUE, RGBColor(0, 140, 60), MAGENTA];
    for (area, g) in root.split_evenly((1, grown.len())).iter().zip(grown) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{:?}", g.backend), ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d((5e3f64..2e7f64).log_scale(), 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("heartbeats of history")
            .y_desc("p50 ÷ p50 at 10^4 heartbeats")
            .x_label_formatter(&|x| format!("{x:.0e}"))
            .label_style(("sans-serif", 14))
            .draw()?;
        chart.draw_series(DashedLineSeries::new(
            [(5e3, 1.2), (2e7, 1.2)],
            6,
            4,
            BLACK.mix(0.6).stroke_width(1),
        ))?;
        for (o, op) in Op::ALL.into_iter().enumerate() {
            let color = colors[o];
            let points: Vec<(f64, f64)> = g
                .built
                .iter()
                .zip(&g.figures)
                .map(|(b, f)| {
                    (
                        b.sent as f64,
                        f.p50[o].as_secs_f64() / g.figures[0].p50[o].as_secs_f64(),
                    )
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(op.short())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() {
    let rt = common::runtime();
    let only = common::only_backend();
    let sizes = match common::only_load() {
        Some(n) => &SIZES[..n.parse::<usize>().expect("how many sizes: 1 to 4")],
        None => &SIZES[..],
    };
    let mut grown = Vec::new();
    for backend in [Backend::Postgres, Backend::Sqlite] {
        if common::wanted(only.as_deref(), backend) {
            grown.push(rt.block_on(grow(backend, sizes)));
        }
    }
    let mut md = String::from("# How cost grows with history\n\n");
    md.push_str(&common::provenance(
        "growth",
        "sequential requests from one client on the same two cores",
    ));
    md.push_str(INTRO);
    for g in &grown {
        section(&mut md, g);
    }
    md.push_str(ANALYSIS);
    println!("{md}");
    if only.is_none() && sizes.len() == SIZES.len() {
        let reports = concat!(env!("CARGO_MANIFEST_DIR"), "/reports");
        plot(&grown, &format!("{reports}/growth.png")).expect("reports/growth.png drawn");
        std::fs::write(format!("{reports}/growth.md"), &md).unwrap();
    }
    // Every size's server stops and its PostgreSQL database is dropped, a partial run's too.
    rt.block_on(async {
        for g in grown {
            for b in g.built {
                b.server.finish().await;
            }
        }
    });
}

const INTRO: &str = r#"Four databases, each grown through the store's own gate and ingest in time order (as
the service would have written them, with fsync off while seeding): 10⁴, 10⁵, 10⁶ and
10⁷ heartbeats of history, over 10, 215, 4,642 and 100,000 orgs. Every 10 minutes ten
sessions start (one of the measured org, `bench`, nine of the other orgs in turn), run an
hour beating every 15 s, then park, as sessions do between turns, until the service's
expiry job ends them a week later (run through the store every simulated hour, as the
service runs it every few seconds): an org keeps a week of parked sessions, no more.
All of the history lies in November, so by the present every session of it has ended:
the present is Tuesday 8 December 12:00, the same at every size, with five of `bench`'s
sessions running, started 10 to 50 minutes before.

On each size, through the service over HTTP (commits fsynced, as in production): a
decision for `bench` (a new session on one of its 100 keys), a heartbeat of one of its
running sessions, its usage page, and its breakdown of the month by project. Each is
asked 100 times a round on each size, 10 rounds after a warm-up round; within a round
the sizes take the requests in turn, one each, so that the machine's drift falls on
every size alike. A figure is the median of the rounds' medians, with the p99 of all
requests beside it. The plot is
reports/growth.png. Target: each cost within 1.2x from the smallest size to
the largest.

"#;

const ANALYSIS: &str = r#"## Reading the figures

- **SQLite holds**: a decision, a heartbeat, the usage page and the breakdown cost the same
  at 10⁷ heartbeats and 100,000 orgs as at 10⁴ and 10 orgs (0.99-1.12x).
- **PostgreSQL holds** since migration 0012: a decision 0.98x (1.47 and 1.44 ms), a
  heartbeat 0.92x, the usage page 1.04x, the breakdown 1.01x. Before it (2026-12-05, same
  benchmark) the decision was 1.27x, 1.93 to 2.45 ms with the whole step from 10⁶ to
  10⁷ (1.11x to 1.21x in earlier runs). What grew, found with auto_explain
  (`log_analyze`, `log_buffers`, `log_wal` per database over `-- postgres 4`, turned on
  after the seeding): one statement, the group's claim with its slot counts
  (`claim_owners_counting_slots`), 0.09 ms and 19 buffers at 10⁴, 0.20 ms and 109 buffers
  at 10⁷; the write (0.15-0.16 ms) and every other statement stayed flat. The slot
  count's two halves had an index each, (org_id, key_id, phase) and (org_id, key_id,
  slot_at) (migration 0010). A generic plan judges a key by the average one, about a
  session, prices both indexes alike and breaks the tie by their size: it counted the
  running sessions through `slot_at` and the slots through `phase`, each reading all 46
  sessions the key had run, ended ones too, to count 4. That bounds a decision by its
  key's history, which a key used for months makes thousands. Asking each open phase by
  equality did not end it alone: with the phase named, the fleet's partial index
  `sessions_open` won for a rare phase (every open session of the fleet read), and with
  the phase a parameter, (org_id, phase) won (the org's sessions of that phase over all
  its keys). Migration 0012 leaves one index to choose: (org_id, phase, key_id, slot_at),
  in place of those three; the count asks each open phase as a parameter, a range of it
  each (13 buffers at 10⁷ where 98 were, 0.08 ms where 0.44 were, by hand), an org's
  reads by phase use its first two columns as before, and a new session writes two index
  entries fewer (the database 240 MB where it was 253).
  `tests/generic_plans.rs::the_slot_count_reads_a_keys_open_sessions_not_its_history`
  (a key of 500 sessions, 10 open, in an org of ten keys, over a fleet half running and
  one mostly ended) fails without the migration (500 rows read and thrown away).
- **One round trip fewer a group**: on one PostgreSQL the slot counts now come in the
  statement that claims the group's new session ids (`claim_owners_counting_slots`,
  src/store/pg/gate.rs; both need only the keys' locks); a group with sessions already known
  counts again after locking them, as before.
- **What was fixed on the way** (migration 0010). The first run of this benchmark showed
  PostgreSQL's decision 4.4x, usage page 6.0x and breakdown 5.5x at 10⁷ (20, 12 and
  9 ms). auto_explain (`log_analyze`, over `cargo bench --bench growth -- postgres 4`)
  named one cause in all three: the reads of an org's sessions by phase (the gate's slot
  count, the window sums' running sessions, the page's session counts, the running
  sessions a page and a breakdown add up to now) run on a *generic* plan (`begin_hot`
  and the keyed pool, src/store/pg/mod.rs), which estimates `org_id = $1` from the average
  org. With 100,000 orgs and 41,496 sessions that is one row, so every index that starts
  with `org_id` looked alike and PostgreSQL took the primary key and filtered by phase:
  5,250 rows of the measured org read to find its 5 running sessions, 4-9 ms a
  statement. The partial index made for the read, `sessions_key_running`, was passed
  over because the churn of sessions through `running` leaves it many pages for its few
  rows (248 pages for 6 rows after VACUUM, reproduced by hand). The usage benchmark did
  not show it: its database holds one org, whose average is itself. Migration 0010
  declares `sessions.org_id` to hold about 100 sessions an org (`n_distinct = -0.01`), so
  that reading a whole org costs what it may and the indexes that name the phase, key or
  slot win, and drops `sessions_key_open` (unread since 0009, a tie beside
  `sessions_key_slot`). The test `generic_plans::
  a_large_org_among_many_small_ones_reads_only_the_sessions_it_counts` (20,000 small
  orgs, one of 5,000 sessions that ran, parked and mostly ended) fails without 0010
  (4,999 rows thrown away by the slot count) and passes with it.
- **A week of parked sessions**: sessions park between turns, and the service's expiry
  job ends those idle for a week; the benchmark runs it as it seeds, so an org keeps a
  week of parked sessions at most. A run without it (the present eight days after the
  history, the job catching up during the timing) left the org's 4,149 parked sessions
  to count on each usage page: SQLite's page grew 1.3-1.5x with them, an index range
  that grows with an org's parked sessions, which the week bounds.
- **Size on disk**: 240 MB on PostgreSQL (250-255 before migration 0012) and 68 MB on
  SQLite for 41,496 session-hours over 100,000 orgs, after VACUUM (docs/operations.md).
"#;
