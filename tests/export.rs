//! Finance exports and closed periods: an export agrees with the breakdown to the second;
//! a closed month's four exports are byte-identical after late heartbeats arrive, which
//! become adjustments of the next month in both exports; bad requests change nothing.

mod common;

use std::collections::BTreeMap;

use common::{breakdown_rows, hb, Backend, Options, TestServer, T0};
use serde_json::{json, Value};

/// 2026-12-01T00:00:00Z: the month boundary, 12 hours after T0.
const B: i64 = T0 + 43_200;
const NOV: &str = "2026-11";
const DEC: &str = "2026-12";

/// Runs three sessions of org_1 (org_2 has none) through the end of November:
/// s1 runs T0..T0+3000 then parks and ends at T0+3600; s2 runs B-600..B+600 then parks;
/// s3 runs B-300..B-30 and falls silent. The clock stops at `until`.
struct Fleet {
    seq: BTreeMap<&'static str, i64>,
}

impl Fleet {
    async fn start(srv: &TestServer) -> Fleet {
        srv.create_org("org_1", "pro").await;
        srv.create_org("org_2", "free").await;
        srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({})))
            .await;
        for (s, agent, project, user) in [
            ("s1", "codex", Some("web"), "u1"),
            ("s2", "claude", None, "u2"),
            ("s3", "opencode", Some("api.v2"), "u1"),
        ] {
            let mut body = json!({"org_id": "org_1", "key_id": "k1", "session_id": s, "agent": agent, "started_by": user});
            if let Some(p) = project {
                body["project_id"] = json!(p);
            }
            srv.admin("POST", "/v1/admissions", Some(body)).await;
        }
        Fleet {
            seq: BTreeMap::new(),
        }
    }

    async fn beat(&mut self, srv: &TestServer, s: &'static str, state: &str, sent_at: i64) {
        let n = self.seq.entry(s).or_insert(0);
        *n += 1;
        let (status, v) = srv
            .heartbeats(vec![hb("org_1", s, *n, state, sent_at)])
            .await;
        assert_eq!(status, 200, "{v}");
    }

    /// Every beat due in `(from, to]`, the clock moving with them.
    async fn run(&mut self, srv: &TestServer, from: i64, to: i64) {
        let mut t = from - from.rem_euclid(15) + 15;
        while t <= to {
            srv.clock.set(t);
            if (T0..=T0 + 3600).contains(&t) {
                let state = if t < T0 + 3000 { "running" } else { "parked" };
                self.beat(srv, "s1", state, t).await;
                if t == T0 + 3600 {
                    srv.admin(
                        "POST",
                        "/v1/sessions/s1/end",
                        Some(json!({"status": "completed"})),
                    )
                    .await;
                }
            }
            if (B - 600..=B + 600).contains(&t) {
                let state = if t < B + 600 { "running" } else { "parked" };
                self.beat(srv, "s2", state, t).await;
            }
            if (B - 300..=B - 30).contains(&t) {
                self.beat(srv, "s3", "running", t).await;
            }
            t += 15;
        }
        srv.clock.set(to);
    }
}

async fn export(srv: &TestServer, period: &str, by: &str, format: &str) -> (String, String) {
    let (status, state, body) = srv
        .get_text(
            &format!("/v1/exports/usage?period={period}&by={by}&format={format}"),
            "rush-period-state",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    (state.unwrap(), body)
}

/// The four exports of a period, and whether it is closed.
async fn all_exports(srv: &TestServer, period: &str) -> (String, Vec<String>) {
    let mut out = Vec::new();
    let mut states = Vec::new();
    for by in ["org", "session"] {
        for format in ["csv", "jsonl"] {
            let (state, body) = export(srv, period, by, format).await;
            states.push(state);
            out.push(body);
        }
    }
    states.dedup();
    assert_eq!(states.len(), 1, "{states:?}");
    (states.remove(0), out)
}

fn jsonl(body: &str) -> Vec<Value> {
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn by_key<'a>(rows: &'a [Value], key: &str) -> BTreeMap<String, &'a Value> {
    rows.iter()
        .map(|r| (r[key].as_str().unwrap().to_owned(), r))
        .collect()
}

/// Seconds of a month by session, from the console's breakdown.
async fn breakdown_by_session(srv: &TestServer, from: &str, to: &str) -> BTreeMap<String, i64> {
    let v = srv
        .admin(
            "GET",
            &format!("/v1/orgs/org_1/usage/breakdown?group_by=session&from={from}&to={to}"),
            None,
        )
        .await;
    breakdown_rows(&v).into_iter().collect()
}

every_backend! {
    async fn a_closed_month_never_changes_and_late_usage_is_adjusted(srv: TestServer) {
        let mut fleet = Fleet::start(&srv).await;
        fleet.run(&srv, T0 - 15, B + 1).await;

        // November, live: the export agrees with the breakdown, session by session.
        let (state, live) = all_exports(&srv, NOV).await;
        assert_eq!(state, "open");
        let sessions = jsonl(&live[3]);
        let got: BTreeMap<String, i64> = sessions
            .iter()
            .map(|r| (r["session_id"].as_str().unwrap().to_owned(), r["running_seconds"].as_i64().unwrap()))
            .collect();
        let mut want = breakdown_by_session(&srv, "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z").await;
        // The console also counts a running session since its last beat, up to one
        // interval (s3: B-30..B-15); an export holds what is booked.
        *want.get_mut("s3").unwrap() -= 15;
        assert_eq!(got, want);
        assert_eq!(want, BTreeMap::from([("s1".into(), 3000), ("s2".into(), 600), ("s3".into(), 270)]));
        let s = by_key(&sessions, "session_id");
        assert_eq!(s["s1"]["parked_seconds"], 600);
        assert_eq!(s["s1"]["spans"], 2);
        assert_eq!(s["s1"]["end_status"], "completed");
        assert_eq!(s["s1"]["first_start"], "2026-11-30T12:00:00Z");
        assert_eq!(s["s1"]["last_end"], "2026-11-30T13:00:00Z");
        assert_eq!(s["s2"]["last_end"], "2026-12-01T00:00:00Z", "clipped to the month");
        assert_eq!(s["s2"]["end_status"], Value::Null);
        let orgs = jsonl(&live[1]);
        let o = by_key(&orgs, "org_id");
        assert_eq!(o["org_1"]["agent_seconds"], 3870);
        assert_eq!(o["org_1"]["agent_hours"], "1.0750");
        assert_eq!(o["org_1"]["amount"], "20.00");
        assert_eq!(o["org_1"]["included_hours"], "40.0000");
        assert_eq!(o["org_2"]["agent_seconds"], 0, "an org without usage still has its line");
        assert_eq!(o["org_2"]["plan"], "free");
        assert!(live[0].starts_with("period_start,period_end,org_id,plan,"), "{}", live[0]);

        // Close November just after midnight; nothing changed, so the bytes are the same.
        srv.clock.set(B + 5);
        let closed = srv.admin("POST", &format!("/v1/periods/{NOV}/close"), None).await;
        assert_eq!(closed["closed"], json!([NOV]));
        let again = srv.admin("POST", &format!("/v1/periods/{NOV}/close"), None).await;
        assert_eq!(again["closed"], json!([]), "closing twice changes nothing");
        let (state, frozen) = all_exports(&srv, NOV).await;
        assert_eq!(state, "closed");
        assert_eq!(frozen, live);

        // s3's supervisor was cut off; its buffered beats arrive late, stamped in November.
        srv.clock.set(B + 10);
        fleet.beat(&srv, "s3", "running", B - 10).await;
        srv.clock.set(B + 14);
        fleet.beat(&srv, "s3", "running", B + 14).await;
        srv.clock.set(B + 20);
        fleet.beat(&srv, "s3", "parked", B + 20).await;

        // The ledger has November's late 30 s; the closed export does not move.
        let ledger = breakdown_by_session(&srv, "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z").await;
        assert_eq!(ledger["s3"], 270 + 30);
        assert_eq!(all_exports(&srv, NOV).await.1, frozen, "a closed month is byte-identical");

        // December shows them as adjustments, in both exports.
        fleet.run(&srv, B + 20, B + 700).await;
        for s in ["s2", "s3"] {
            srv.admin("POST", &format!("/v1/sessions/{s}/end"), Some(json!({"status": "completed"}))).await;
        }
        let (state, dec) = all_exports(&srv, DEC).await;
        assert_eq!(state, "open");
        let o = jsonl(&dec[1]);
        let o = by_key(&o, "org_id");
        assert_eq!(o["org_1"]["adjustment_seconds"], 30);
        assert_eq!(o["org_1"]["agent_seconds"], 600 + 14 + 6);
        assert_eq!(o["org_2"]["adjustment_seconds"], 0);
        let s = jsonl(&dec[3]);
        let s = by_key(&s, "session_id");
        assert_eq!(s["s3"]["adjustment_seconds"], 30);
        assert_eq!(s["s3"]["running_seconds"], 20);
        assert_eq!(s["s2"]["adjustment_seconds"], 0);
        assert!(!s.contains_key("s1"), "s1 ended in November: {s:?}");
        // Closed + adjustment = the ledger, to the second.
        let nov_total = by_key(&jsonl(&frozen[1]), "org_id")["org_1"]["agent_seconds"].as_i64().unwrap();
        assert_eq!(nov_total + 30, ledger.values().sum::<i64>());

        // Closing December freezes its adjustments too.
        let jan = rush_meter_core::export::parse_month("2027-01").unwrap().start;
        srv.clock.set(jan + 60);
        srv.admin("POST", &format!("/v1/periods/{DEC}/close"), None).await;
        let (state, dec_closed) = all_exports(&srv, DEC).await;
        assert_eq!(state, "closed");
        assert_eq!(dec_closed, dec, "nothing changed since the live export");
        assert_eq!(all_exports(&srv, NOV).await.1, frozen);
        let periods = srv.admin("GET", "/v1/periods", None).await;
        let p = &periods["periods"];
        assert_eq!(p[0]["period"], DEC);
        assert_eq!(p[0]["adjustment_seconds"], 30);
        assert_eq!(p[0]["agent_seconds"], 620);
        assert_eq!(p[1]["period"], NOV);
        assert_eq!(p[1]["agent_seconds"], 3870);
        assert_eq!(p[1]["orgs"], 2);
        assert_eq!(p[1]["sessions"], 3);
    }

    async fn bad_export_requests_are_refused_and_change_nothing(srv: TestServer) {
        srv.create_org("org_1", "pro").await;
        srv.clock.set(B + 100);
        let console = srv.token(&[rush_meter::tokens::Scope::Console], Some("org_1")).await;
        let finance = srv.token(&[rush_meter::tokens::Scope::Finance], None).await;
        let before = srv.db.digest().await.unwrap();
        for (path, field) in [
            ("/v1/exports/usage?period=2026-13", "period"),
            ("/v1/exports/usage?period=2026-1", "period"),
            ("/v1/exports/usage", "period"),
            ("/v1/exports/usage?period=2027-01", "period"),
            ("/v1/exports/usage?period=2026-11&by=team", "by"),
            ("/v1/exports/usage?period=2026-11&format=xlsx", "format"),
        ] {
            let (status, v) = srv.call("GET", path, Some(common::ADMIN), None).await;
            assert_eq!(status, 422, "{path}: {v}");
            assert_eq!(v["error"]["code"], "invalid_value", "{path}: {v}");
            assert_eq!(v["error"]["field"], field, "{path}: {v}");
        }
        for path in ["/v1/periods/2026-12/close", "/v1/periods/2027-02/close", "/v1/periods/12-2026/close",
                     "/v1/periods/2026-10/close", "/v1/periods/1026-11/close"] {
            let (status, v) = srv.call("POST", path, Some(common::ADMIN), None).await;
            assert_eq!(status, 422, "{path}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains("period"), "{v}");
        }
        let (status, v) = srv.call("GET", "/v1/exports/usage?period=2026-11", Some(&console), None).await;
        assert_eq!(status, 403, "{v}");
        let (status, v) = srv.call("POST", "/v1/periods/2026-11/close", Some(&finance), None).await;
        assert_eq!(status, 403, "finance reads periods, admin closes them: {v}");
        assert_eq!(srv.db.digest().await.unwrap(), before);
        let (status, _) = srv.call("GET", "/v1/exports/usage?period=2026-11", Some(&finance), None).await;
        assert_eq!(status, 200);
    }
}

every_backend!(
    serve_closes_a_month_after_the_settling_delay,
    an_export_read_by_nobody_is_cut_short
);

/// `serve` closes a month by itself once the settling delay has passed.
async fn serve_closes_a_month_after_the_settling_delay(backend: Backend) {
    let opts = Options {
        period_settle: Some(3600),
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    srv.create_org("org_1", "pro").await;
    let periods = || async {
        srv.admin("GET", "/v1/periods", None).await["periods"]
            .as_array()
            .unwrap()
            .len()
    };
    // When the delay is over is `export::due_month`'s unit test; this is the job running.
    srv.clock.set(B + 3600);
    common::eventually(15, "November is closed", || async { periods().await == 1 }).await;
}

/// An export whose client stops reading is cut short after `export_stall`: its database
/// connection is freed and the body ends in an error, never as if it were complete.
async fn an_export_read_by_nobody_is_cut_short(backend: Backend) {
    let opts = Options {
        export_stall: std::time::Duration::from_secs(1),
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    srv.create_org("org_1", "pro").await;
    // 120,000 sessions (about 8 MB of lines): more than the sockets between the two hold
    // (a loopback send buffer grows to 4 MB).
    for batch in 0..240 {
        let beats = (0..500)
            .flat_map(|i| {
                let s = format!("s{batch}x{i}");
                [
                    // An interval apart, as a supervisor beats: applied at once.
                    hb("org_1", &s, 1, "running", T0 - 25),
                    hb("org_1", &s, 2, "parked", T0 - 10),
                ]
            })
            .collect();
        let (status, v) = srv.heartbeats(beats).await;
        assert_eq!(status, 200, "{v}");
    }
    srv.clock.set(B + 60);
    let path = format!("/v1/exports/usage?period={NOV}&by=session");
    // An open month (its lines computed live), then the same month closed (its frozen
    // lines read with a COPY on PostgreSQL, whose connection is closed when left mid-way).
    stall_export(&srv, &path).await;
    let (status, _) = srv.call("GET", &path, Some(common::ADMIN), None).await;
    assert_eq!(status, 200, "the meter goes on answering exports");
    srv.admin("POST", &format!("/v1/periods/{NOV}/close"), None)
        .await;
    stall_export(&srv, &path).await;
    // Every connection of the pool still answers: a whole export, again and again.
    for _ in 0..4 {
        let (_, body) = export(&srv, NOV, "session", "csv").await;
        assert_eq!(
            body.lines().count(),
            120_001,
            "a header and every session's line"
        );
    }
}

/// Ask for the export at `path` and read nothing for three times the stall limit: the body
/// must come in part and end as incomplete.
async fn stall_export(srv: &TestServer, path: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr: std::net::SocketAddr = srv.url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    conn.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: meter\r\n\
             Authorization: Bearer {}\r\nConnection: close\r\n\r\n",
            common::ADMIN
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = vec![0; 1024];
    let n = conn.read(&mut head).await.unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    // The client reads nothing for three times the limit: the stimulus, not a wait.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest).await;
    let response = [&head[..n], &rest[..]].concat();
    let (complete, body) = chunked_body(&response);
    assert!(
        !complete,
        "the body ended as if complete after {body} bytes"
    );
    assert!(body > 0, "nothing of the body came");
}

/// Whether an HTTP/1.1 response's chunked body ends with its last (empty) chunk, and how
/// many body bytes came.
fn chunked_body(response: &[u8]) -> (bool, usize) {
    let start = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the headers end")
        + 4;
    let (mut at, mut bytes) = (start, 0);
    loop {
        let Some(eol) = response[at..].windows(2).position(|w| w == b"\r\n") else {
            return (false, bytes);
        };
        let size = usize::from_str_radix(std::str::from_utf8(&response[at..at + eol]).unwrap(), 16)
            .expect("a chunk size");
        if size == 0 {
            return (true, bytes);
        }
        at += eol + 2;
        if response.len() < at + size + 2 {
            return (false, bytes + response.len().saturating_sub(at));
        }
        bytes += size;
        at += size + 2;
    }
}
