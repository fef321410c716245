//! [`SpecKey`]: the idempotency key a tool's declaration says, made from each call.

use super::call::Call;
use super::parts::KeyPart;
use crate::key::{Action, KeyError};
use std::sync::Arc;

/// The idempotency key a declaration says: the run and the step if its parts name them (`-`
/// where they do not), the tool's name always, and the named argument fields (identifiers:
/// `"4471"` is `4471`). Its fingerprint covers those and every top-level number and boolean:
/// the same key with another amount is refused `idempotency_key_reused` by the receipts, not
/// answered with the first's result; reworded free text (a string) is the same action.
#[derive(Clone, Debug)]
pub(super) struct SpecKey {
    pub(super) tool: Arc<str>,
    pub(super) parts: Arc<[KeyPart]>,
}

impl SpecKey {
    /// The action `call` stands for.
    pub(super) fn action(&self, call: &Call) -> Result<Action, KeyError> {
        let has = |p: &KeyPart| self.parts.contains(p);
        let run = if has(&KeyPart::Run) { call.run() } else { "-" };
        let step = if has(&KeyPart::Step) {
            call.step()
        } else {
            "-"
        };
        let fields: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match p {
                KeyPart::Id(f) | KeyPart::Text(f) => Some(f.as_str()),
                _ => None,
            })
            .collect();
        // An identifier that is `null` identifies nothing: two actions without one would share
        // a key (and the second be answered with the first's receipt).
        let null = |f: &&str| call.args().get(*f).is_some_and(serde_json::Value::is_null);
        if fields.iter().any(null) {
            return Err(KeyError::new(
                "args",
                "an identity field the key covers is null: give the identifier",
            ));
        }
        if fields.is_empty() {
            Action::of_identity(run, step, &self.tool, call.args())
        } else {
            Action::task_value(run, step, &self.tool, call.args(), &fields)
        }
    }
}

impl crate::key::MakeIdempotencyKey<Call> for SpecKey {
    fn make_key(&self, call: &Call) -> Result<Action, KeyError> {
        self.action(call)
    }
}
