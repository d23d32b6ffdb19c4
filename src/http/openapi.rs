//! The OpenAPI 3.1 document, generated from the handlers' annotations: the router and the
//! document are built from the same `routes!` lists (see `super::router`), so neither can
//! name a route the other lacks.
//!
//! Errors are described once per status here and attached to each operation by the
//! groups below; every error body is `ErrorBody`.

use std::collections::BTreeMap;

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    schema::SchemaType, Object, ObjectBuilder, OpenApi as Document, Ref, RefOr, Type,
};
use utoipa::{IntoResponses, Modify, OpenApi};

use rush_meter_core::ids::Id;

use super::error::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "rush-meter",
        description = "Metering, quota and billing for cloud coding agents: the agent-hour \
            ledger, the admission gate, usage, exports and Stripe billing. Prose: docs/api.md.",
    ),
    // Schemas only a query parameter names: a body's types are gathered from the routes.
    components(schemas(ErrorBody, rush_meter_core::export::By, rush_meter_core::export::Format)),
    modifiers(&BearerAuth),
    tags(
        (name = "orgs", description = "Orgs and their API keys"),
        (name = "plans", description = "Plan versions, and moving orgs between them"),
        (name = "gate", description = "Admission decisions"),
        (name = "ledger", description = "Heartbeats and sessions"),
        (name = "usage", description = "The console's usage pages"),
        (name = "funding", description = "Past the plan: hour grants and pay-as-you-go"),
        (name = "billing", description = "Stripe checkout, portal and webhooks"),
        (name = "limits", description = "Hour limits inside an org, on its users, projects and keys"),
        (name = "finance", description = "Exports and closed periods"),
        (name = "audit", description = "Who changed what"),
        (name = "admin", description = "Operators' queues"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
        (name = "tokens", description = "API tokens: the caller's own, and an admin's list, making and revoking"),
        (name = "console", description = "The operator console's page and assets (docs/console.md)"),
    )
)]
pub struct ApiDoc;

/// The `bearer` scheme every protected operation names.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut Document) {
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token minted with `rush-meter token create` or `POST /v1/tokens`; its \
                         scopes say which routes it may call, and a token bound to an org acts \
                         on that org only, whatever its scopes.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Schemas no type says (`schema_with = …`): ids and their pattern, and value sets that
/// are not one enum's (the sources that may fund a decision, a rule's names). Values that
/// are one enum's take its schema by `value_type`.
pub mod strings {
    use super::*;

    fn one_of(values: &[&str]) -> Object {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(values.iter().copied()))
            .build()
    }

    /// A string, or `null` when `nullable`.
    fn string(nullable: bool) -> ObjectBuilder {
        let t = if nullable {
            SchemaType::from_iter([Type::String, Type::Null])
        } else {
            SchemaType::Type(Type::String)
        };
        ObjectBuilder::new().schema_type(t)
    }

    pub fn id() -> Object {
        rush_meter_core::ids::schema()
    }

    pub fn limit_kind() -> Object {
        one_of(rush_meter_core::members::LimitKind::NAMES)
    }

    pub fn id_or_null() -> Object {
        string(true).pattern(Some(Id::PATTERN)).build()
    }

    pub fn funded_by() -> Object {
        use rush_meter_core::funding::Source;
        // Grace pays for no decision: a run that only grace would fund is refused.
        let sources: Vec<&str> = Source::ALL
            .iter()
            .filter(|s| **s != Source::Grace)
            .map(|s| s.as_str())
            .collect();
        one_of(&sources)
    }

    /// A decision's rule: the two that allow, or the reason it was refused.
    pub fn rule() -> Object {
        one_of(&rush_meter_core::gate::Rule::names())
    }
}

/// What each error status means, wherever it is answered.
fn description(status: u16) -> &'static str {
    match status {
        400 => {
            "`malformed_body` (or `invalid_signature` on the webhook): the body, query or \
                path could not be read; `field` names the bad part when known"
        }
        401 => {
            "`unauthorized`: no token, or not a valid one; `token_revoked` or \
                `token_expired`: one that no longer works"
        }
        403 => {
            "`forbidden`: the token lacks the scope, or is bound to one org and the route \
                covers every org"
        }
        404 => {
            "`org_not_found`, `session_not_found`, `key_not_found` or `not_found`: \
                nothing by that id, or an org the token is not bound to (answered as if it \
                did not exist)"
        }
        409 => {
            "`session_conflict` (a session id named without its org that several orgs \
                have), `session_ended`, \
                `already_on_plan`, `stripe_conflict` or `conflict`: the current state forbids \
                the change"
        }
        413 => "`body_too_large`: over RUSH_METER_MAX_BODY_BYTES",
        415 => "`unsupported_media_type`: a body not sent as `application/json`",
        422 => "`invalid_value`: a value out of range or ill-formed; `field` names it",
        429 => "`rate_limited`: this token is over its rate; wait `Retry-After` seconds",
        500 => "`internal`: an unexpected error, logged with the request id",
        502 => "`stripe_refused`: Stripe refused the change; nothing changed here",
        503 => {
            "`unavailable` (the database): retry after `Retry-After` seconds; nothing was \
                written, unless the connection was lost at the commit, and then the retry is \
                answered as a repeat (a heartbeat's `seq`, an admission's session, a grant's \
                `idempotency_key`). `stripe_unavailable`: nothing changed; retry after \
                `Retry-After` seconds. `stripe_off`: Stripe is not configured on \
                this instance, and a retry will not help"
        }
        _ => "an error",
    }
}

fn error_response(status: u16) -> RefOr<Response> {
    let mut resp = ResponseBuilder::new()
        .description(description(status))
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        );
    if matches!(status, 429 | 503) {
        resp = resp.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                )
                .description(Some("seconds to wait before retrying"))
                .build(),
        );
    }
    RefOr::T(resp.build())
}

fn errors(statuses: &[u16]) -> BTreeMap<String, RefOr<Response>> {
    statuses
        .iter()
        .map(|s| (s.to_string(), error_response(*s)))
        .collect()
}

/// Declares a group of error statuses an operation lists in its `responses(...)`.
macro_rules! error_group {
    ($(#[$doc:meta])* $name:ident = [$($status:literal),+]) => {
        $(#[$doc])*
        pub struct $name;
        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                errors(&[$($status),+])
            }
        }
    };
}

error_group!(
    /// Every operation behind a token: refused, limited, or the database is down.
    Guarded = [401, 403, 429, 500, 503]
);
error_group!(
    /// A JSON body: unreadable, too large, not JSON, or a value out of range.
    BadBody = [400, 413, 415, 422]
);
error_group!(
    /// Query parameters: unreadable or out of range.
    BadQuery = [400, 422]
);
error_group!(
    /// An id in the path: unreadable (not UTF-8), ill-formed, or nothing by that id.
    BadId = [400, 404, 422]
);
error_group!(
    /// A path that is not UTF-8 once decoded.
    BadPath = [400]
);
error_group!(
    /// A change the current state forbids.
    Conflicting = [409]
);
error_group!(
    /// Stripe signs what it sends; an open route, so only these and the body's errors.
    Unsigned = [400, 413, 500, 503]
);
error_group!(
    /// A call to Stripe: refused by it, or it is unreachable (503, within `Guarded`).
    StripeCalls = [409, 502, 503]
);
error_group!(
    /// The database is down.
    Unready = [503]
);
