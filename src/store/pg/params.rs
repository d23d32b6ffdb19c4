//! Parameters of PostgreSQL's set-based statements, numbered as they are bound.

use super::*;

/// A statement's parameters, numbered in the order they are added: each `array` binds
/// its values and gives back the text that names it (`$n::type`), so that the text and the
/// binds cannot drift apart however many a statement takes. The order is fixed by the
/// code, so a statement keeps one text (prepared once per connection).
pub(super) struct Params {
    pub(super) args: sqlx::postgres::PgArguments,
    count: usize,
}

impl Params {
    pub(super) fn new() -> Params {
        Params {
            args: Default::default(),
            count: 0,
        }
    }

    /// Bind `values` (an array, or a scalar) as the next parameter, cast to `cast`.
    pub(super) fn add<T>(&mut self, cast: &str, values: T) -> String
    where
        T: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + Send + 'static,
    {
        use sqlx::Arguments as _;
        self.args
            .add(values)
            .expect("arrays of plain values encode");
        self.count += 1;
        format!("${}::{cast}", self.count)
    }

    /// One column of `rows` as an array parameter.
    pub(super) fn column<R, T>(
        &mut self,
        cast: &str,
        rows: impl IntoIterator<Item = R>,
        f: impl Fn(R) -> T,
    ) -> String
    where
        Vec<T>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + Send + 'static,
    {
        self.add(cast, rows.into_iter().map(f).collect::<Vec<T>>())
    }

    /// Every column of `rows`, in `SESSION_COLUMNS` order, as `UNNEST`'s arguments.
    pub(super) fn sessions(&mut self, rows: &[Session]) -> String {
        let text = [
            self.column("text[]", rows, |r| r.org_id.clone()),
            self.column("text[]", rows, |r| r.session_id.clone()),
            self.column("text[]", rows, |r| r.key_id.clone()),
            self.column("text[]", rows, |r| r.agent.clone()),
            self.column("text[]", rows, |r| r.project_id.clone()),
            self.column("text[]", rows, |r| r.started_by.clone()),
            self.column("text[]", rows, |r| r.vm_id.clone()),
            self.column("text[]", rows, |r| r.ledger.phase.as_str()),
            self.column("int8[]", rows, |r| r.ledger.last_seq),
            self.column("int8[]", rows, |r| r.ledger.last_at),
            self.column("int8[]", rows, |r| r.ledger.span_start),
            self.column("int8[]", rows, |r| r.ledger.billed_seconds),
            self.column("int8[]", rows, |r| r.ledger.heartbeats),
            self.column("int8[]", rows, |r| r.ledger.silences),
            self.column("bool[]", rows, |r| r.unadmitted),
            self.column("int8[]", rows, |r| r.created_at),
            self.column("int8[]", rows, |r| r.ledger.ended_at),
            self.column("text[]", rows, |r| {
                r.ledger.end_status.map(EndStatus::as_str)
            }),
            self.column("int8[]", rows, |r| r.heard_at),
            self.column("int8[]", rows, |r| held_columns(&r.ledger.held).0),
            self.column("text[]", rows, |r| held_columns(&r.ledger.held).1),
        ];
        text.join(", ")
    }
}
