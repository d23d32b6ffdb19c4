//! A database URL that names several hosts, as libpq and pg_auto_failover give it
//! (`postgres://u@h1:p1,h2:p2/db?target_session_attrs=read-write`): the service connects to
//! the first host that accepts writes, and after an outage or a read-only answer looks again
//! (`Pg::follow`), so that a promoted standby on another address is found without a
//! restart.
//!
//! Written here because sqlx reads one host a URL ("invalid port number" for a list) and
//! ignores `target_session_attrs`; the rest of each host's URL is sqlx's to read.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::store::{StoreError, StoreResult};

/// How long a host is given to answer when looking for the writable one: all are asked at
/// once, within the breaker's second (`Db::reachable`).
const PROBE: Duration = Duration::from_millis(800);

/// The hosts of a database URL, in its order, and whether a writable one is wanted.
#[derive(Clone, Debug)]
pub struct Hosts {
    pub each: Vec<PgConnectOptions>,
    /// `target_session_attrs=read-write` (or `primary`): a host in recovery or read-only is
    /// passed over. Without it (or `any`), the first that answers.
    pub writable: bool,
}

/// Split `url` into one URL a host, `target_session_attrs` taken out (sqlx does not know
/// it); a URL of one host is one. Errors name the fix.
pub fn parse(url: &str) -> StoreResult<Hosts> {
    let config = |m: String| StoreError::Other(sqlx::Error::Configuration(m.into()));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| config(format!("database URL `{}` has no scheme", redact(url))))?;
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let mut writable = false;
    let mut kept = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("target_session_attrs", v)) => {
                writable = match v {
                    "read-write" | "primary" => true,
                    "any" | "" => false,
                    other => {
                        return Err(config(format!(
                            "target_session_attrs `{other}` in the database URL: use read-write \
                             (the host that accepts writes) or any"
                        )))
                    }
                }
            }
            _ if !pair.is_empty() => kept.push(pair),
            _ => {}
        }
    }
    let query = match kept.is_empty() {
        true => String::new(),
        false => format!("?{}", kept.join("&")),
    };
    let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let each = hostlist
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(config(format!(
                    "an empty host in the database URL `{}`",
                    redact(url)
                )));
            }
            Ok(PgConnectOptions::from_str(&format!(
                "{scheme}://{user}{host}{path}{query}"
            ))?)
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Hosts { each, writable })
}

/// The URL without its password, for an error message.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:…{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl Hosts {
    /// More than one host: worth looking again after an outage.
    pub fn several(&self) -> bool {
        self.each.len() > 1
    }

    /// The first host, in the URL's order, that answers within `PROBE` (and, when
    /// `writable`, accepts writes), all asked at once; the error of the last one when none
    /// does.
    pub async fn pick(&self) -> StoreResult<PgConnectOptions> {
        let asked = self.each.iter().map(|opts| async move {
            match tokio::time::timeout(PROBE, probe(opts, self.writable)).await {
                Ok(answer) => answer,
                Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
            }
        });
        let answers = futures_util::future::join_all(asked).await;
        let mut last = None;
        for (opts, answer) in self.each.iter().zip(answers) {
            match answer {
                Ok(()) => return Ok(opts.clone()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            StoreError::Other(sqlx::Error::Configuration(
                "no host in the database URL".into(),
            ))
        }))
    }
}

/// Connect to one host and, if `writable` is wanted, ask whether it accepts writes.
async fn probe(opts: &PgConnectOptions, writable: bool) -> StoreResult<()> {
    let mut conn = opts.connect().await?;
    let read_only: String = sqlx::query_scalar("SELECT current_setting('transaction_read_only')")
        .fetch_one(&mut conn)
        .await?;
    let _ = conn.close().await;
    if writable && read_only != "off" {
        return Err(StoreError::Unavailable(sqlx::Error::Protocol(format!(
            "{}:{} accepts no writes",
            opts.get_host(),
            opts.get_port()
        ))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_of_several_hosts_is_a_url_a_host() {
        let h = parse(
            "postgres://u:pw@h1:6001,h2:6002/fo?sslmode=disable&target_session_attrs=read-write",
        )
        .unwrap();
        assert!(h.writable && h.several());
        let hosts: Vec<(String, u16, Option<String>)> = h
            .each
            .iter()
            .map(|o| {
                (
                    o.get_host().to_owned(),
                    o.get_port(),
                    o.get_database().map(str::to_owned),
                )
            })
            .collect();
        assert_eq!(
            hosts,
            vec![
                ("h1".into(), 6001, Some("fo".into())),
                ("h2".into(), 6002, Some("fo".into()))
            ]
        );
        assert_eq!(h.each[1].get_username(), "u");
        let one = parse("postgres://postgres@127.0.0.1:5432/db").unwrap();
        assert!(!one.several() && !one.writable);
        assert!(parse("postgres://h1,,h2/db").is_err());
        let e = parse("postgres://u:secret@h1,h2/db?target_session_attrs=standby").unwrap_err();
        assert!(e.to_string().contains("target_session_attrs"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
