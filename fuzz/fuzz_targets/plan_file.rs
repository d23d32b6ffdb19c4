//! A plan file's text: refused with the field to fix, or a plan whose figures hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rush_meter_fuzz::plans::parse_plan;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_plan(text) {
        Ok(p) => {
            assert!(p.monthly_limit_seconds >= 0 && p.weekly_limit_seconds >= 0);
            assert!((1..=p.concurrency_max).contains(&p.concurrency_default));
            assert!(p.concurrency_max <= 100);
            assert!(!p.price.is_sign_negative() || p.price.is_zero());
            assert!(p.upgrade_to.as_deref() != Some(p.id.as_str()));
        }
        Err(message) => assert!(!message.is_empty()),
    }
});
