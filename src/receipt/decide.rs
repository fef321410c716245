//! The receipt layer's decisions, as pure functions of plain inputs: what a stale intent calls
//! for ([`stale`]), and what a call's result does to its intent ([`plan`]). The future in
//! `run.rs` only carries them out.

use super::codec::Codec;
use super::read_back::Consistency;
use super::run::Settings;
use crate::class::ToolClass;
use crate::classify::{FailureClass, KeyConflict, Verdict};

/// What the stale intent of this class calls for.
pub(super) enum Stale {
    /// Send again with the same key: the provider (or the call's nature) deduplicates it.
    Resume,
    /// Ask the provider whether the effect is there.
    ReadBack,
    /// Nobody can tell: escalate.
    Escalate,
}

/// The decision for an intent whose executor is gone (a crash, an ambiguous failure), by class,
/// the intent's age and the provider's key window: a keyed write older than the window is no
/// longer deduplicated by the provider, so it counts as unkeyed.
pub(super) fn stale(settings: &Settings, age_ms: u64) -> Stale {
    let keyed = match settings.class {
        ToolClass::Read | ToolClass::IdempotentWrite => true,
        ToolClass::KeyedWrite => u128::from(age_ms) <= settings.key_window.as_millis(),
        ToolClass::UnkeyedWrite | ToolClass::MultiStep => false,
    };
    match settings.class {
        _ if keyed => Stale::Resume,
        ToolClass::UnkeyedWrite | ToolClass::KeyedWrite
            if settings.consistency == Consistency::Immediate =>
        {
            Stale::ReadBack
        }
        _ => Stale::Escalate,
    }
}

/// What a call's result does to its intent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// A success: these bytes are its receipt.
    Record(Vec<u8>),
    /// A success whose result could not be encoded (why): no receipt, the intent stays.
    NotEncoded(String),
    /// A success the codec stores nothing of (a streamed answer): the intent stays.
    NoReceipt,
    /// The provider holds the key from an earlier request (409, 422): the intent stays.
    KeyHeld(KeyConflict),
    /// It may have taken effect (an ambiguous failure, a streamed answer), and may still land.
    InDoubt,
    /// It provably did not take effect.
    Abandon,
}

/// The plan for a result, by its verdict, any key conflict and whether the codec stores it.
///
/// | result | verdict | key conflict | plan |
/// |---|---|---|---|
/// | `Ok` | `Success` | any | `Record` (`NotEncoded` if the codec fails; `NoReceipt` with [`NotStored`](super::NotStored)) |
/// | `Ok` | `Empty` (404, 410, gRPC `NOT_FOUND`: no such record) | any | `Abandon`: nothing was done, and a receipt of "nothing" would answer every reissue without sending it (a route not deployed yet, an id the model corrected) |
/// | any | a failure | `InProgress`, `Reused` | `KeyHeld` |
/// | any | `Ambiguous`, or an `Err` called a success | none | `InDoubt` |
/// | any | any other failure | none | `Abandon` |
pub(super) fn plan<Res, E, Cd: Codec<Res>>(
    result: &Result<Res, E>,
    verdict: Verdict,
    conflict: Option<KeyConflict>,
    codec: &Cd,
) -> Plan {
    match (result, verdict, conflict) {
        (Ok(_), Verdict::Empty, None) => Plan::Abandon,
        (Ok(res), Verdict::Success | Verdict::Empty, _) if codec.stores() => {
            match codec.encode(res) {
                Ok(bytes) => Plan::Record(bytes),
                Err(e) => Plan::NotEncoded(e.to_string()),
            }
        }
        (Ok(_), Verdict::Success | Verdict::Empty, _) => Plan::NoReceipt,
        (_, Verdict::Failure(_), Some(conflict)) => Plan::KeyHeld(conflict),
        // An `Err` called a success: nothing to store, and it may have taken effect.
        (_, Verdict::Failure(FailureClass::Ambiguous) | Verdict::Success | Verdict::Empty, _) => {
            Plan::InDoubt
        }
        _ => Plan::Abandon,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BoxError;

    /// A codec that stores a `u32` as its decimal digits, and refuses 0.
    #[derive(Clone)]
    struct Digits;
    impl Codec<u32> for Digits {
        fn encode(&self, res: &u32) -> Result<Vec<u8>, BoxError> {
            match res {
                0 => Err("zero".into()),
                n => Ok(n.to_string().into_bytes()),
            }
        }
        fn decode(&self, bytes: &[u8]) -> Result<u32, BoxError> {
            Ok(std::str::from_utf8(bytes)?.parse()?)
        }
    }

    /// Every verdict, key conflict and codec, against the table of `plan`.
    #[test]
    fn what_a_result_does_to_its_intent() {
        use FailureClass::*;
        let ok: Result<u32, ()> = Ok(7);
        let err: Result<u32, ()> = Err(());
        let success = Verdict::Success;
        let fails = |class| Verdict::Failure(class);
        let codec = Digits;
        let streamed = super::super::codec::NotStored;
        assert_eq!(
            plan(&ok, success, None, &codec),
            Plan::Record(b"7".to_vec())
        );
        assert_eq!(plan(&ok, Verdict::Empty, None, &codec), Plan::Abandon);
        assert_eq!(
            plan(&Ok::<u32, ()>(0), success, None, &codec),
            Plan::NotEncoded("zero".into())
        );
        assert_eq!(plan(&ok, success, None, &streamed), Plan::NoReceipt);
        for conflict in [KeyConflict::InProgress, KeyConflict::Reused] {
            for class in [Transient, Ambiguous, ModelRecoverable, Permanent, Policy] {
                for result in [&ok, &err] {
                    assert_eq!(
                        plan(result, fails(class), Some(conflict), &codec),
                        Plan::KeyHeld(conflict)
                    );
                }
            }
        }
        assert_eq!(plan(&err, fails(Ambiguous), None, &codec), Plan::InDoubt);
        assert_eq!(plan(&ok, fails(Ambiguous), None, &codec), Plan::InDoubt);
        // An `Err` called a success: nothing to store, it may have taken effect.
        assert_eq!(plan(&err, success, None, &codec), Plan::InDoubt);
        for class in [Transient, ModelRecoverable, Permanent, Policy] {
            assert_eq!(plan(&err, fails(class), None, &codec), Plan::Abandon);
            assert_eq!(plan(&ok, fails(class), None, &codec), Plan::Abandon);
        }
    }
}
