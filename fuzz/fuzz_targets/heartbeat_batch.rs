//! A supervisor's batch body: any bytes are refused with a reason or become heartbeats
//! that keep the batch's promises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rush_meter_fuzz::batch::{parse, BatchError, MAX_BATCH};
use rush_meter_fuzz::ledger::Rules;

const NOW: i64 = 1_796_040_000;
const RULES: Rules = Rules {
    interval: 15,
    lease: 45,
};

fuzz_target!(|data: &[u8]| {
    let any = parse(data, None, NOW, &RULES);
    let bound = parse(data, Some("acme"), NOW, &RULES);
    match &any {
        Ok(beats) => {
            assert!(!beats.is_empty() && beats.len() <= MAX_BATCH);
            for b in beats {
                assert!(b.obs.seq >= 0);
                // Reporters' clocks are trusted back one lease, never ahead of the meter.
                assert!((NOW - RULES.lease..=NOW).contains(&b.obs.at));
                assert_eq!(b.received_at, NOW);
            }
            // An org-bound token takes the batch only if it is all that org's.
            let all_acme = beats.iter().all(|b| b.org_id.as_str() == "acme");
            assert_eq!(bound.is_ok(), all_acme);
            if !all_acme {
                assert!(matches!(bound, Err(BatchError::OtherOrg { .. })));
            }
        }
        Err(BatchError::Invalid { field, message })
        | Err(BatchError::OtherOrg {
            field,
            org_id: message,
        }) => {
            assert!(field.starts_with("heartbeats"), "{field}");
            assert!(!message.is_empty());
        }
        Err(BatchError::Malformed(e)) => assert!(!e.message.is_empty()),
    }
});
