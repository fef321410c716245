//! The saga's durable record: what a run of it has decided, as the bytes of a receipt.

use serde::{Deserialize, Serialize};

/// What a saga run has decided, recorded once under the run's saga key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decided", rename_all = "snake_case")]
pub(super) enum Decided {
    /// Every step is done.
    Completed,
    /// Step `failed` (its index) failed for good with `code`: the steps before it are undone.
    Compensate { failed: usize, code: String },
}

impl Decided {
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(super) fn from_bytes(bytes: &[u8]) -> Option<Decided> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The key a saga run's decision is recorded under.
pub(super) fn decision_key(saga: &str, run: &str) -> String {
    format!("saga:{saga}:{run}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_reads_back_as_written() {
        for d in [
            Decided::Completed,
            Decided::Compensate {
                failed: 3,
                code: String::from("invalid_argument"),
            },
        ] {
            assert_eq!(Decided::from_bytes(&d.to_bytes()), Some(d));
        }
        assert_eq!(Decided::from_bytes(b"not json"), None);
    }
}
