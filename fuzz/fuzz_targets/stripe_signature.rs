//! The `Stripe-Signature` header and body of a webhook: never a panic, never a pass without
//! the secret, and always a pass for what Stripe itself would sign.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rush_meter_fuzz::signature::{parse, sign, verify};

const NOW: i64 = 1_796_040_000;
const TOLERANCE: i64 = 300;
const SECRET: &str = "whsec_fuzz";

fuzz_target!(|data: &[u8]| {
    // The first line is the header, the rest the body.
    let (head, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(header) = std::str::from_utf8(head) else {
        return;
    };
    let _ = parse(header);
    let secrets = [SECRET.to_owned()];
    if let Ok(t) = verify(Some(header), body, &secrets, NOW, TOLERANCE) {
        // A pass means the header carries the HMAC of this body under the secret.
        assert!((t - NOW).abs() <= TOLERANCE);
        let expected = sign(SECRET, t, body);
        let mac = expected.rsplit("v1=").next().unwrap();
        assert!(header.to_ascii_lowercase().contains(mac), "{header}");
    }
    // What Stripe signs passes, whatever the body.
    let signed = sign(SECRET, NOW, body);
    assert_eq!(
        verify(Some(&signed), body, &secrets, NOW, TOLERANCE),
        Ok(NOW)
    );
    // ... and not under another secret.
    assert!(verify(
        Some(&signed),
        body,
        &["whsec_other".to_owned()],
        NOW,
        TOLERANCE
    )
    .is_err());
});
