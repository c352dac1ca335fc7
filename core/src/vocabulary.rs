//! The words the SQL API and its clients share: a record's status, the answers of `idem_reserve`
//! and `idem_release`, and how a call of a client ended (the label of its traces and metrics).
//! Each word is written here once; the extension, the client and the layer parse and print them
//! through these types.

use std::fmt;

/// Why a word was not one of the vocabulary's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} must be one of {allowed}, got {got:?}")]
pub struct UnknownWord {
    /// What the word names (`status`, `idem_reserve outcome`, ...).
    pub what: &'static str,
    /// The words allowed.
    pub allowed: &'static str,
    /// The word found.
    pub got: String,
}

macro_rules! vocabulary {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident => $word:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every word, in order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word, as the SQL API spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word),+
                }
            }

            /// Parses the word as the SQL API spells it (exactly).
            pub fn parse(word: &str) -> Result<Self, UnknownWord> {
                match word {
                    $($word => Ok($name::$variant),)+
                    other => Err(UnknownWord {
                        what: $what,
                        allowed: concat!($($word, " "),+),
                        got: other.to_owned(),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

vocabulary! {
    /// The status of a record (`idem_records.status`).
    Status, "status" {
        /// An attempt holds the key.
        Processing => "PROCESSING",
        /// Done: replayed to every retry.
        Success => "SUCCESS",
        /// A permanent failure (or retries exhausted), replayed as failed.
        Failed => "FAILED",
        /// A key with a recovery point whose attempt ended without finishing: the next
        /// reservation resumes it from that point (docs/recovery-points.md).
        Resumable => "RESUMABLE",
    }
}

impl Status {
    /// Whether `idem_complete` may record it (`SUCCESS` or `FAILED`).
    pub fn is_final(self) -> bool {
        matches!(self, Status::Success | Status::Failed)
    }
}

vocabulary! {
    /// The `outcome` column of `idem_reserve`.
    ReserveWord, "idem_reserve outcome" {
        /// The caller now owns the key.
        Created => "created",
        /// The caller now owns a key with a recovery point, and continues from it.
        Resume => "resume",
        /// A `SUCCESS` record with the same request.
        Replay => "replay",
        /// A `FAILED` record with the same request.
        Failed => "failed",
        /// Another attempt holds the key.
        InProgress => "in_progress",
        /// A live record with a different request.
        Mismatch => "mismatch",
    }
}

vocabulary! {
    /// What `idem_release` did (its answer).
    ReleaseOutcome, "idem_release answer" {
        /// The record was deleted: a retry runs again.
        Released => "released",
        /// `max_retries` transient failures: the record is now `FAILED`.
        Poisoned => "poisoned",
        /// The token no longer holds the key.
        Stale => "stale",
    }
}

vocabulary! {
    /// How one call of a client ended, as its traces and metrics label it (`outcome`).
    Decision, "decision" {
        /// The handler ran and its result was committed with the key.
        Executed => "executed",
        /// An earlier attempt's result was replayed.
        Replayed => "replayed",
        /// The handler's result was transient: its writes were undone and the key released.
        Released => "released",
        /// As released, but that was the key's last allowed transient failure.
        Poisoned => "poisoned",
        /// Another attempt holds the key.
        InProgress => "in_progress",
        /// The key was used with a different request.
        Mismatch => "mismatch",
        /// The key failed for good: its stored failure (if any) was answered.
        Failed => "failed",
        /// The attempt lost its lease; its work was rolled back.
        LeaseLost => "lease_lost",
        /// The store could not be reached.
        StoreUnavailable => "store_unavailable",
        /// The request was answered before it reached the store (a bad key, no user, a body too large).
        Rejected => "rejected",
        /// Any other error.
        Error => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_parses_back() {
        for s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Ok(*s));
        }
        for w in ReserveWord::ALL {
            assert_eq!(ReserveWord::parse(w.as_str()), Ok(*w));
        }
        for r in ReleaseOutcome::ALL {
            assert_eq!(ReleaseOutcome::parse(&r.to_string()), Ok(*r));
        }
        for d in Decision::ALL {
            assert_eq!(Decision::parse(d.as_str()), Ok(*d));
        }
    }

    #[test]
    fn unknown_words_name_what_and_the_rule() {
        let e = Status::parse("success").unwrap_err();
        assert_eq!(e.to_string(), "status must be one of PROCESSING SUCCESS FAILED RESUMABLE , got \"success\"");
        assert!(ReserveWord::parse("created ").is_err());
        assert!(!Status::Processing.is_final() && Status::Success.is_final() && Status::Failed.is_final());
        assert!(!Status::Resumable.is_final());
    }
}
