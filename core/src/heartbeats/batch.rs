//! A host supervisor's heartbeat batch, as it arrives: decoded, then validated whole
//! before anything is written. The fuzz target `heartbeat_batch` drives `parse`.

use serde::Deserialize;
use utoipa::openapi::schema::SchemaType;
use utoipa::openapi::{KnownFormat, Object, ObjectBuilder, SchemaFormat, Type};
use utoipa::ToSchema;

use super::Heartbeat;
use crate::ids::Id;
use crate::ledger::{Observation, Rules, VmState};
use crate::time::{rfc3339, Secs};
use crate::wire::{decode, DecodeError};

/// Heartbeats one request may carry.
pub const MAX_BATCH: usize = 1000;

/// 1 to 1,000 heartbeats, committed all or none.
#[derive(Deserialize, ToSchema)]
pub struct Batch {
    pub heartbeats: Vec<RawHeartbeat>,
}

#[derive(Deserialize, ToSchema)]
pub struct RawHeartbeat {
    #[schema(schema_with = crate::ids::schema)]
    pub org_id: String,
    #[schema(schema_with = crate::ids::schema)]
    pub session_id: String,
    #[schema(schema_with = crate::ids::schema)]
    pub vm_id: String,
    /// The supervisor's sequence number for this session, 0 or more; a repeat is a no-op.
    #[schema(minimum = 0)]
    pub seq: i64,
    #[schema(schema_with = vm_state_schema)]
    pub state: String,
    /// When the supervisor saw the state; default: when it arrives.
    #[schema(schema_with = sent_at_schema)]
    pub sent_at: Option<String>,
}

fn vm_state_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(VmState::NAMES.iter().copied()))
        .description(Some("`running` (billed) or `parked` (free)"))
        .build()
}

fn sent_at_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .description(Some(
            "RFC 3339; when the supervisor saw the state (default: on arrival)",
        ))
        .build()
}

/// Why a batch is refused; nothing of it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Not the JSON of a batch (400).
    Malformed(DecodeError),
    /// A value out of range (422).
    Invalid { field: String, message: String },
    /// A heartbeat of another org than the token's (404, as for an org that does not
    /// exist, so that it reveals nothing).
    OtherOrg { field: String, org_id: String },
}

/// Decode and validate a batch body.
pub fn parse(
    bytes: &[u8],
    bound_org: Option<&str>,
    now: Secs,
    rules: &Rules,
) -> Result<Vec<Heartbeat>, BatchError> {
    let batch: Batch = decode(bytes).map_err(BatchError::Malformed)?;
    validate(batch.heartbeats, bound_org, now, rules)
}

/// Validate a whole batch before anything is written; the error names the bad field.
pub fn validate(
    batch: Vec<RawHeartbeat>,
    bound_org: Option<&str>,
    now: Secs,
    rules: &Rules,
) -> Result<Vec<Heartbeat>, BatchError> {
    if batch.is_empty() || batch.len() > MAX_BATCH {
        return Err(BatchError::Invalid {
            field: "heartbeats".into(),
            message: format!(
                "send 1 to {MAX_BATCH} heartbeats a request (got {})",
                batch.len()
            ),
        });
    }
    batch
        .into_iter()
        .enumerate()
        .map(|(i, raw)| validate_one(i, raw, bound_org, now, rules))
        .collect()
}

fn validate_one(
    i: usize,
    raw: RawHeartbeat,
    bound_org: Option<&str>,
    now: Secs,
    rules: &Rules,
) -> Result<Heartbeat, BatchError> {
    let field = |name: &str| format!("heartbeats[{i}].{name}");
    let invalid = |name: &str, message: String| BatchError::Invalid {
        field: field(name),
        message,
    };
    let id = |name: &str, v: &str| Id::parse(v).map_err(|m| invalid(name, format!("{name} {m}")));
    let org_id = id("org_id", &raw.org_id)?;
    let session_id = id("session_id", &raw.session_id)?;
    let vm_id = id("vm_id", &raw.vm_id)?;
    if raw.seq < 0 {
        return Err(invalid("seq", "seq must be 0 or more".into()));
    }
    let state =
        VmState::parse_named(&raw.state).map_err(|e| invalid("state", format!("state {e}")))?;
    let sent_at = match &raw.sent_at {
        Some(t) => rfc3339::parse(t).map_err(|m| invalid("sent_at", m))?,
        None => now,
    };
    if bound_org.is_some_and(|o| o != org_id.as_str()) {
        return Err(BatchError::OtherOrg {
            field: field("org_id"),
            org_id: org_id.into_string(),
        });
    }
    Ok(Heartbeat {
        org_id,
        session_id,
        vm_id,
        obs: Observation {
            seq: raw.seq,
            at: rules.clamp_sent_at(sent_at, now),
            state,
        },
        received_at: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules {
        interval: 15,
        lease: 45,
    };

    #[test]
    fn a_batch_parses_into_heartbeats_with_clamped_times() {
        let body = br#"{"heartbeats":[{"org_id":"o","session_id":"s","vm_id":"v","seq":3,"state":"parked"}]}"#;
        let beats = parse(body, None, 1_000, &RULES).unwrap();
        assert_eq!(beats.len(), 1);
        assert_eq!(beats[0].obs.seq, 3);
        assert_eq!(beats[0].obs.state, VmState::Parked);
        assert_eq!(beats[0].obs.at, 1_000);
    }

    #[test]
    fn errors_name_the_field() {
        let bad_state =
            br#"{"heartbeats":[{"org_id":"o","session_id":"s","vm_id":"v","seq":1,"state":"x"}]}"#;
        assert!(matches!(
            parse(bad_state, None, 0, &RULES),
            Err(BatchError::Invalid { field, .. }) if field == "heartbeats[0].state"
        ));
        let bad_type = br#"{"heartbeats":[{"org_id":"o","session_id":"s","vm_id":"v","seq":"1","state":"running"}]}"#;
        assert!(matches!(
            parse(bad_type, None, 0, &RULES),
            Err(BatchError::Malformed(DecodeError { field: Some(f), .. })) if f == "heartbeats[0].seq"
        ));
        let other = br#"{"heartbeats":[{"org_id":"o","session_id":"s","vm_id":"v","seq":1,"state":"running"}]}"#;
        assert!(matches!(
            parse(other, Some("p"), 0, &RULES),
            Err(BatchError::OtherOrg { org_id, .. }) if org_id == "o"
        ));
        assert!(matches!(
            parse(br#"{"heartbeats":[]}"#, None, 0, &RULES),
            Err(BatchError::Invalid { field, .. }) if field == "heartbeats"
        ));
    }
}
