//! [`Mode`]: how a route's handler relates to the key's record. Plain data.

/// How a route's handler relates to the key's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The handler writes through the request's [`Connection`](crate::Connection); its writes and the stored
    /// response commit together.
    InTransaction,
    /// The handler's effects leave the database: lease, heartbeat, complete after the handler.
    TwoPhase,
}

impl Mode {
    /// The `mode` of spans: `in_transaction`, `two_phase`.
    pub fn label(self) -> &'static str {
        match self {
            Mode::InTransaction => "in_transaction",
            Mode::TwoPhase => "two_phase",
        }
    }
}
