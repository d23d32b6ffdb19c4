//! API tokens: scopes, secrets, the hashes that are all the database keeps, a token's
//! life (expiry, revocation), and when each was last used.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::store::TokenRow;
use rush_meter_core::time::Secs;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Heartbeats and session end, from the host supervisors.
    Ingest,
    /// The gate, from the orchestrator.
    Admission,
    /// Usage of the one org the token is bound to, from the console.
    Console,
    /// Exports of every org.
    Finance,
    /// Everything.
    Admin,
    /// A Team member's own use in its org: the one user and org the token is bound to.
    Member,
}

impl Scope {
    pub const ALL: [Scope; 6] = [
        Scope::Ingest,
        Scope::Admission,
        Scope::Console,
        Scope::Finance,
        Scope::Admin,
        Scope::Member,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Admission => "admission",
            Scope::Console => "console",
            Scope::Finance => "finance",
            Scope::Admin => "admin",
            Scope::Member => "member",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parse `admission,ingest` into scopes; the error names the unknown one.
pub fn parse_scopes(list: &str) -> Result<Vec<Scope>, String> {
    let mut scopes = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let scope = Scope::parse(part).ok_or_else(|| {
            format!(
                "unknown scope `{part}`: use ingest, admission, console, finance, admin or member"
            )
        })?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    if scopes.is_empty() {
        return Err("at least one scope is needed".into());
    }
    scopes.sort();
    Ok(scopes)
}

pub fn join_scopes(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// SHA-256 of a secret, hex: what is stored and looked up. Secrets are 256 random bits,
/// so a fast hash is enough (no password stretching needed).
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A new token: its row (hash only) and the secret, shown once.
pub fn new_token(
    scopes: &[Scope],
    org_id: Option<&str>,
    label: &str,
    now: Secs,
) -> (TokenRow, String) {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    let secret = format!("rm_{}", hex::encode(bytes));
    (token_row(&secret, scopes, org_id, label, now), secret)
}

/// What a token to be made must hold to: a console token reads one org, so it must be
/// bound to one; a member token reads one user's use in one org, so it is bound to both
/// and has no other scope. The error says what to fix: `(field, message)`.
pub fn check_binding(
    scopes: &[Scope],
    org_id: Option<&str>,
    user_id: Option<&str>,
) -> Result<(), (&'static str, String)> {
    if scopes.contains(&Scope::Console) && org_id.is_none() {
        return Err((
            "org_id",
            "a console token reads one org; bind it to one".into(),
        ));
    }
    let member = scopes.contains(&Scope::Member);
    if member && scopes.len() > 1 {
        return Err((
            "scopes",
            "a member token reads its user's own page and nothing else: `member` alone".into(),
        ));
    }
    match (member, org_id, user_id) {
        (true, None, _) => Err((
            "org_id",
            "a member token reads one org; bind it to one".into(),
        )),
        (true, _, None) => Err((
            "user_id",
            "a member token reads one user's use; name the user (an admission's started_by)".into(),
        )),
        (false, _, Some(_)) => Err((
            "user_id",
            "only a member token is bound to a user; add the scope `member`".into(),
        )),
        _ => Ok(()),
    }
}

/// The longest a token may be made to last by `expires_in` (ten years).
pub const MAX_LIFETIME: Secs = 10 * 366 * 86_400;

/// Why a token that exists is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Revoked,
    Expired,
}

rush_meter_core::named! {
    /// Where a token stands.
    pub enum TokenState {
        /// It may be used.
        Active = "active",
        /// Past its `expires_at`.
        Expired = "expired",
        /// Revoked: refused everywhere within seconds (docs/api.md, "Tokens").
        Revoked = "revoked",
    }
}

impl TokenRow {
    /// Where the token stands at `now`.
    pub fn state_at(&self, now: Secs) -> TokenState {
        match self.usable_at(now) {
            Ok(()) => TokenState::Active,
            Err(Refused::Revoked) => TokenState::Revoked,
            Err(Refused::Expired) => TokenState::Expired,
        }
    }

    /// Whether the token may be used at `now`.
    pub fn usable_at(&self, now: Secs) -> Result<(), Refused> {
        if self.revoked_at.is_some() {
            return Err(Refused::Revoked);
        }
        match self.expires_at {
            Some(at) if now >= at => Err(Refused::Expired),
            _ => Ok(()),
        }
    }
}

/// When each token was last used, gathered in memory and written in batches by a job
/// (`app::jobs`): a write a request would be, on Citus, a distributed transaction on
/// the tokens' reference table.
#[derive(Debug, Default)]
pub struct LastUsed(Mutex<HashMap<String, Secs>>);

impl LastUsed {
    pub fn touch(&self, token_id: &str, at: Secs) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(token_id) {
            Some(t) => *t = (*t).max(at),
            None => {
                seen.insert(token_id.to_owned(), at);
            }
        }
    }

    /// What was gathered since the last call, by token id.
    pub fn take(&self) -> Vec<(String, Secs)> {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, Secs)> = std::mem::take(&mut *seen).into_iter().collect();
        out.sort();
        out
    }

    /// Put back what could not be written, keeping anything newer.
    pub fn restore(&self, batch: Vec<(String, Secs)>) {
        for (id, at) in batch {
            self.touch(&id, at);
        }
    }
}

/// The row for a given secret (the bootstrap admin token's secret comes from config).
pub fn token_row(
    secret: &str,
    scopes: &[Scope],
    org_id: Option<&str>,
    label: &str,
    now: Secs,
) -> TokenRow {
    let hash = hash_secret(secret);
    TokenRow {
        token_id: format!("tok_{}", &hash[..16]),
        secret_hash: hash,
        scopes: join_scopes(scopes),
        org_id: org_id.map(str::to_owned),
        user_id: None,
        label: label.to_owned(),
        created_at: now,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_dedup_and_name_the_unknown() {
        assert_eq!(
            parse_scopes("ingest, admission,ingest").unwrap(),
            vec![Scope::Ingest, Scope::Admission]
        );
        assert!(parse_scopes("ingest,root").unwrap_err().contains("`root`"));
        assert!(parse_scopes(" , ").is_err());
    }

    #[test]
    fn a_token_is_refused_once_revoked_or_from_its_expiry_on() {
        let (mut row, _) = new_token(&[Scope::Ingest], None, "x", 0);
        assert_eq!(row.usable_at(1_000_000), Ok(()));
        row.expires_at = Some(100);
        assert_eq!(row.usable_at(99), Ok(()));
        assert_eq!(row.usable_at(100), Err(Refused::Expired));
        row.revoked_at = Some(50);
        assert_eq!(row.usable_at(10), Err(Refused::Revoked));
    }

    #[test]
    fn last_used_keeps_the_latest_and_is_taken_once() {
        let seen = LastUsed::default();
        seen.touch("a", 10);
        seen.touch("a", 5);
        seen.touch("b", 7);
        assert_eq!(seen.take(), vec![("a".into(), 10), ("b".into(), 7)]);
        assert_eq!(seen.take(), vec![]);
        seen.touch("a", 12);
        seen.restore(vec![("a".into(), 11), ("c".into(), 3)]);
        assert_eq!(seen.take(), vec![("a".into(), 12), ("c".into(), 3)]);
    }

    #[test]
    fn console_tokens_are_bound() {
        assert!(check_binding(&[Scope::Console], None, None).is_err());
        assert!(check_binding(&[Scope::Console], Some("acme"), None).is_ok());
        assert!(check_binding(&[Scope::Admin], None, None).is_ok());
        let member = [Scope::Member];
        assert!(check_binding(&member, Some("acme"), Some("ann")).is_ok());
        assert_eq!(
            check_binding(&member, None, Some("ann")).unwrap_err().0,
            "org_id"
        );
        assert_eq!(
            check_binding(&member, Some("acme"), None).unwrap_err().0,
            "user_id"
        );
        let two = [Scope::Console, Scope::Member];
        assert_eq!(
            check_binding(&two, Some("acme"), Some("ann"))
                .unwrap_err()
                .0,
            "scopes"
        );
        let console = [Scope::Console];
        assert_eq!(
            check_binding(&console, Some("acme"), Some("ann"))
                .unwrap_err()
                .0,
            "user_id"
        );
    }

    #[test]
    fn only_the_hash_is_kept() {
        let (row, secret) = new_token(&[Scope::Admin], None, "x", 0);
        assert!(!row.secret_hash.contains(&secret[3..]));
        assert_eq!(row.secret_hash, hash_secret(&secret));
        assert_eq!(row.scopes, "admin");
    }
}
