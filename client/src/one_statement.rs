//! The statement of the in-transaction flow in one statement ([`OneStatement`], for
//! `Idempotency::run_statement` in `handle/one_statement.rs`; the flow itself is
//! `flow::one_statement`): for work that is one data-modifying statement, the reservation, the
//! write and the completion travel as ONE statement in autocommit: one round trip, one commit,
//! no subtransaction.

use crate::error::{DatabaseError, Error};
use crate::sql::Param;
use serde_json::Value;

/// A data-modifying statement of yours and its values, for [`crate::Idempotency::run_statement`].
///
/// Two rules make it one statement with the reservation:
/// - it reads the relation **`created`**, which has one row when this call created the key and
///   none otherwise (`INSERT ... SELECT ... FROM created`, `UPDATE ... FROM created`, `DELETE
///   ... USING created`), so it writes nothing for a replay or a key in progress;
/// - it has a **`RETURNING`** clause of at most one row: that row, as a JSON object of its
///   columns, is the stored response, and what a replay returns.
///
/// Its values are `$1`, `$2`, ... in the order they are added; their types are `text`,
/// `integer`, `bigint`, `double precision`, `boolean` and `jsonb` (cast in the statement for
/// others: `$3::uuid` from a text value).
///
/// ```
/// use idempotency_client::OneStatement;
/// let charge = OneStatement::new("INSERT INTO charges (user_id, amount) SELECT $1, $2 FROM created RETURNING id")
///     .text("user-42")
///     .int8(100);
/// ```
#[derive(Debug, Clone)]
pub struct OneStatement<'a> {
    pub(crate) sql: &'a str,
    pub(crate) params: Vec<Param<'a>>,
}

impl<'a> OneStatement<'a> {
    /// The statement `sql`, with no values yet.
    pub fn new(sql: &'a str) -> Self {
        OneStatement { sql, params: Vec::new() }
    }

    /// A `text` value.
    pub fn text(mut self, value: &'a str) -> Self {
        self.params.push(Param::Text(value));
        self
    }

    /// An `integer` value.
    pub fn int4(mut self, value: i32) -> Self {
        self.params.push(Param::Int4(value));
        self
    }

    /// A `bigint` value.
    pub fn int8(mut self, value: i64) -> Self {
        self.params.push(Param::Int8(value));
        self
    }

    /// A `double precision` value (`None`: NULL).
    pub fn float8(mut self, value: Option<f64>) -> Self {
        self.params.push(Param::Float(value));
        self
    }

    /// A `boolean` value.
    pub fn bool(mut self, value: bool) -> Self {
        self.params.push(Param::Bool(value));
        self
    }

    /// A `jsonb` value (`None`: NULL).
    pub fn json(mut self, value: Option<&'a Value>) -> Self {
        self.params.push(Param::Json(value));
        self
    }

    /// The rules a client can check before a round trip: the statement reads `created` and
    /// returns its row.
    pub(crate) fn check(&self) -> Result<(), Error<DatabaseError>> {
        let lower = self.sql.to_ascii_lowercase();
        let words: Vec<&str> = lower.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
        for (word, rule) in [
            ("created", "must read the relation `created` (one row when this call created the key), e.g. INSERT ... SELECT ... FROM created"),
            ("returning", "must have a RETURNING clause: its row is the stored response"),
        ] {
            if !words.contains(&word) {
                return Err(Error::Configuration { reason: format!("run_statement: the statement {rule}"), source: None });
            }
        }
        Ok(())
    }
}
