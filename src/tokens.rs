//! API tokens: scopes, secrets, and the hashes that are all the database keeps.

use std::fmt;

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
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::Ingest,
        Scope::Admission,
        Scope::Console,
        Scope::Finance,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Admission => "admission",
            Scope::Console => "console",
            Scope::Finance => "finance",
            Scope::Admin => "admin",
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
            format!("unknown scope `{part}`: use ingest, admission, console, finance or admin")
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
        label: label.to_owned(),
        created_at: now,
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
    fn only_the_hash_is_kept() {
        let (row, secret) = new_token(&[Scope::Admin], None, "x", 0);
        assert!(!row.secret_hash.contains(&secret[3..]));
        assert_eq!(row.secret_hash, hash_secret(&secret));
        assert_eq!(row.scopes, "admin");
    }
}
