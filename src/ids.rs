//! The ids this service makes, in one place: a kind's prefix and its randomness.
//! (Ids derived from what they name, such as a token's from its hash, are made there.)

/// What an id names, and so its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A grant of hours (`grt_`).
    Grant,
    /// A gate decision (`dec_`).
    Decision,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Grant => "grt",
            Kind::Decision => "dec",
        }
    }
}

/// A fresh id of `kind`: its prefix and 16 random hex digits (64 bits: no two alike in
/// any ledger's life).
pub fn mint(kind: Kind) -> String {
    format!("{}_{:016x}", kind.prefix(), rand::random::<u64>())
}

/// A fresh audit entry id: `aud_`, 16 hex digits of nanoseconds since the epoch (read
/// from this machine's clock and never repeated or going back within the process), and 6
/// random ones. Entries are listed by their time and then this id, so those of one second
/// list in the order they were made (across instances, as far as their clocks agree). A
/// ULID would do the same; this is the four lines it takes.
pub fn audit() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let prev = LAST.fetch_max(now, Ordering::SeqCst);
    let t = if now > prev {
        now
    } else {
        LAST.fetch_add(1, Ordering::SeqCst) + 1
    };
    format!("aud_{t:016x}{:06x}", rand::random::<u32>() & 0xff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_kind_and_never_repeat() {
        let (a, b) = (mint(Kind::Grant), mint(Kind::Grant));
        assert!(a.starts_with("grt_") && a.len() == 20, "{a}");
        assert_ne!(a, b);
        assert!(mint(Kind::Decision).starts_with("dec_"));
        let ids: Vec<String> = (0..1000).map(|_| audit()).collect();
        assert!(
            ids.windows(2).all(|w| w[0][..20] < w[1][..20]),
            "audit ids keep their order"
        );
    }
}
