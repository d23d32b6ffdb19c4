//! `Stripe-Signature` verification: `t=<unix time>,v1=<hex HMAC-SHA256 of "t.body">`, with
//! any number of `v1` values (Stripe sends one per active secret during a rollover) and
//! possibly other schemes (`v0`), which are ignored.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::time::Secs;

/// Why a webhook was refused; each says what to check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing Stripe-Signature header")]
    Missing,
    #[error("Stripe-Signature header is malformed: {0}")]
    Malformed(&'static str),
    #[error("Stripe-Signature timestamp is {age} s from now, beyond the {tolerance} s tolerance (a replay, or a clock out of step)")]
    Stale { age: Secs, tolerance: Secs },
    #[error("no v1 signature matches any configured webhook secret (check RUSH_METER_STRIPE_WEBHOOK_SECRET)")]
    NoMatch,
}

/// The parts of a `Stripe-Signature` header this service reads.
#[derive(Debug, PartialEq, Eq)]
pub struct Header {
    pub timestamp: Secs,
    pub v1: Vec<Vec<u8>>,
}

pub fn parse(header: &str) -> Result<Header, SignatureError> {
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed("expected key=value pairs"))?;
        match k {
            "t" if timestamp.is_some() => return Err(SignatureError::Malformed("two timestamps")),
            "t" => {
                timestamp = Some(
                    v.parse::<Secs>()
                        .map_err(|_| SignatureError::Malformed("t is not a Unix time"))?,
                )
            }
            "v1" => {
                v1.push(hex::decode(v).map_err(|_| SignatureError::Malformed("v1 is not hex"))?)
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed("no t= timestamp"))?;
    if v1.is_empty() {
        return Err(SignatureError::Malformed("no v1= signature"));
    }
    Ok(Header { timestamp, v1 })
}

/// Verify `body` against `header` with any of `secrets`; returns the signed timestamp.
/// The timestamp must be within `tolerance` seconds of `now`, either way.
pub fn verify(
    header: Option<&str>,
    body: &[u8],
    secrets: &[String],
    now: Secs,
    tolerance: Secs,
) -> Result<Secs, SignatureError> {
    let h = parse(header.ok_or(SignatureError::Missing)?)?;
    // Saturating: `t` is whatever the sender wrote, up to i64's ends.
    let age = now.saturating_sub(h.timestamp);
    if age.unsigned_abs() > tolerance.unsigned_abs() {
        return Err(SignatureError::Stale { age, tolerance });
    }
    let matches = secrets.iter().any(|secret| {
        h.v1.iter().any(|sig| {
            // verify_slice compares in constant time.
            mac(secret, h.timestamp, body).verify_slice(sig).is_ok()
        })
    });
    if matches {
        Ok(h.timestamp)
    } else {
        Err(SignatureError::NoMatch)
    }
}

fn mac(secret: &str, timestamp: Secs, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// A header as Stripe would send it, for tests and for the notifications this service signs.
pub fn sign(secret: &str, timestamp: Secs, body: &[u8]) -> String {
    let sig = mac(secret, timestamp, body).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Secs = 1_800_000_000;
    const BODY: &[u8] = br#"{"id":"evt_1","type":"customer.subscription.updated"}"#;

    fn secrets() -> Vec<String> {
        vec!["whsec_new".into(), "whsec_old".into()]
    }

    #[test]
    fn a_good_signature_within_tolerance_passes() {
        for age in [-299, 0, 299, 300] {
            let h = sign("whsec_old", NOW - age, BODY);
            assert_eq!(verify(Some(&h), BODY, &secrets(), NOW, 300), Ok(NOW - age));
        }
    }

    #[test]
    fn stale_tampered_or_foreign_signatures_fail() {
        let h = sign("whsec_new", NOW - 301, BODY);
        assert!(matches!(
            verify(Some(&h), BODY, &secrets(), NOW, 300),
            Err(SignatureError::Stale { age: 301, .. })
        ));
        let mut flipped = BODY.to_vec();
        flipped[10] ^= 1;
        let h = sign("whsec_new", NOW, BODY);
        assert_eq!(
            verify(Some(&h), &flipped, &secrets(), NOW, 300),
            Err(SignatureError::NoMatch)
        );
        let h = sign("whsec_other", NOW, BODY);
        assert_eq!(
            verify(Some(&h), BODY, &secrets(), NOW, 300),
            Err(SignatureError::NoMatch)
        );
        assert_eq!(
            verify(None, BODY, &secrets(), NOW, 300),
            Err(SignatureError::Missing)
        );
        for bad in [
            "",
            "t=x,v1=00",
            "v1=00",
            &format!("t={NOW}"),
            &format!("t={NOW},v1=zz"),
        ] {
            assert!(
                matches!(
                    verify(Some(bad), BODY, &secrets(), NOW, 300),
                    Err(SignatureError::Malformed(_))
                ),
                "{bad}"
            );
        }
    }

    /// A timestamp at i64's ends is stale, not an overflow.
    #[test]
    fn extreme_timestamps_are_stale() {
        for t in [i64::MIN, i64::MIN + 1, i64::MAX] {
            let header = format!("t={t},v1=00");
            assert!(matches!(
                verify(Some(&header), b"{}", &secrets(), 1_796_040_000, 300),
                Err(SignatureError::Stale { .. })
            ));
        }
    }

    #[test]
    fn any_v1_value_may_match_in_either_order() {
        let good = sign("whsec_new", NOW, BODY);
        let good_sig = good.split_once(",v1=").unwrap().1;
        let wrong = "ab".repeat(32);
        for h in [
            format!("t={NOW},v1={wrong},v1={good_sig}"),
            format!("t={NOW},v1={good_sig},v1={wrong}"),
            format!("t={NOW},v0={wrong},v1={good_sig}"),
        ] {
            assert_eq!(verify(Some(&h), BODY, &secrets(), NOW, 300), Ok(NOW), "{h}");
        }
    }
}
