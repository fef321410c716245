//! The action a side effect stands for: its idempotency key and the fingerprint of the
//! arguments that must match for a repeat to be the same action.

use super::{digest_hex, to_value, IdempotencyKey, KeyError};
use serde::Serialize;

/// The identity of one side effect: its idempotency key and a fingerprint of the arguments that
/// must match for a repeat to be the same action.
///
/// ```
/// use serde_json::json;
/// use stormguard::key::Action;
///
/// let a = Action::new("run-1", "step-2", "charge", &json!({"order": 7, "cents": 1200}))?;
/// let b = Action::new("run-1", "step-2", "charge", &json!({"cents": 1200, "order": 7}))?;
/// assert_eq!(a, b); // field order does not matter
/// let c = Action::new("run-1", "step-3", "charge", &json!({"order": 7, "cents": 1200}))?;
/// assert_ne!(a.key(), c.key()); // another step is another action
/// # Ok::<(), stormguard::key::KeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    key: IdempotencyKey,
    fingerprint: String,
}

fn fingerprint_of(value: &serde_json::Value) -> Result<String, KeyError> {
    digest_hex(value)
}

/// An identifier as the key reads it, where that differs from how it was written: a string
/// holding an integer as the integer is written is that integer (`"4471"` is `4471`: the model
/// writes an id either way; `"04471"` and `"+4471"` stay strings, other ids), and surrounding
/// whitespace is not part of an identifier (`" 4471"`). `None`: as written.
pub(crate) fn normalized_id(value: &serde_json::Value) -> Option<serde_json::Value> {
    let serde_json::Value::String(s) = value else {
        return None;
    };
    let t = s.trim();
    // Only the integer's own spelling: "0012" and "12" (a zero-padded id), "+12", are other ids.
    if let Ok(n) = t.parse::<u64>() {
        if n.to_string() == t {
            return Some(n.into());
        }
    } else if let Ok(n) = t.parse::<i64>() {
        if n.to_string() == t {
            return Some(n.into());
        }
    }
    (t.len() != s.len()).then(|| t.into())
}

/// `args` with its identifier fields `fields` normalized ([`normalized_id`]); `None` where none
/// changes (the common case: no copy).
fn with_ids_normalized(args: &serde_json::Value, fields: &[&str]) -> Option<serde_json::Value> {
    let object = args.as_object()?;
    if !fields
        .iter()
        .any(|f| object.get(*f).and_then(normalized_id).is_some())
    {
        return None;
    }
    let mut copy = object.clone();
    for f in fields {
        if let Some(v) = copy.get_mut(*f) {
            if let Some(n) = normalized_id(v) {
                *v = n;
            }
        }
    }
    Some(serde_json::Value::Object(copy))
}

/// The named identifier fields of `args` ([`pick`]), each normalized ([`normalized_id`]):
/// what a key covers.
pub(super) fn pick_ids(
    args: &serde_json::Value,
    fields: &[&str],
) -> Result<serde_json::Value, KeyError> {
    let picked = pick(args, fields)?;
    Ok(with_ids_normalized(&picked, fields).unwrap_or(picked))
}

/// The named top-level fields of `args`, each required (a missing field is an error, never
/// `null`).
pub(super) fn pick(
    args: &serde_json::Value,
    fields: &[&str],
) -> Result<serde_json::Value, KeyError> {
    if fields.is_empty() {
        return Err(KeyError::new(
            "args",
            "name at least one field (with none, every action of the step would share one key)",
        ));
    }
    let serde_json::Value::Object(object) = args else {
        return Err(KeyError::new(
            "args",
            "must be a JSON object to pick identity fields from",
        ));
    };
    fields
        .iter()
        .map(|f| match object.get(*f) {
            Some(v) => Ok(((*f).to_string(), v.clone())),
            None => Err(KeyError::new(
                "args",
                "lacks a field the key covers (missing or misspelled)",
            )),
        })
        .collect::<Result<serde_json::Map<_, _>, _>>()
        .map(serde_json::Value::Object)
}

impl Action {
    /// Key and fingerprint over all of `args`.
    pub fn new(
        run: &str,
        step: &str,
        tool: &str,
        args: &impl Serialize,
    ) -> Result<Action, KeyError> {
        let value = to_value(args)?;
        // The key's hash and the fingerprint are one digest of the same arguments: made once.
        let fingerprint = fingerprint_of(&value)?;
        Ok(Action {
            key: IdempotencyKey::from_hash(run, step, tool, &fingerprint)?,
            fingerprint,
        })
    }

    /// For a task-shaped tool: the key covers the `identity` fields, the fingerprint the
    /// `material` ones (a free-text field the model may reword belongs to neither).
    ///
    /// ```
    /// use serde_json::json;
    /// use stormguard::key::Action;
    ///
    /// let first = json!({"invoice_id": 4471, "to": "ap@acme.test", "body": "Dear customer"});
    /// let reworded = json!({"invoice_id": 4471, "to": "ap@acme.test", "body": "Hello"});
    /// let identity = ["invoice_id"];
    /// let material = ["invoice_id", "to"];
    /// assert_eq!(
    ///     Action::task("run-1", "step-2", "send_invoice", &first, &identity, &material)?,
    ///     Action::task("run-1", "step-2", "send_invoice", &reworded, &identity, &material)?,
    /// );
    /// # Ok::<(), stormguard::key::KeyError>(())
    /// ```
    pub fn task(
        run: &str,
        step: &str,
        tool: &str,
        args: &impl Serialize,
        identity: &[&str],
        material: &[&str],
    ) -> Result<Action, KeyError> {
        let value = to_value(args)?;
        let material = pick(&value, material)?;
        let material = with_ids_normalized(&material, identity).unwrap_or(material);
        Ok(Action {
            key: IdempotencyKey::derive_fields(run, step, tool, &value, identity)?,
            fingerprint: fingerprint_of(&material)?,
        })
    }

    /// [`task`](Self::task) for arguments that are JSON already (a declared tool's): the key
    /// covers `fields`, the fingerprint those and every top-level number and boolean (an
    /// amount, a quantity, a flag), so a repeat that changes one (an amount corrected) is
    /// refused `idempotency_key_reused`, never answered with the first's receipt, while free
    /// text the model rewords on a resume (a string) is neither. The arguments are not written
    /// out and read back.
    pub(crate) fn task_value(
        run: &str,
        step: &str,
        tool: &str,
        args: &serde_json::Value,
        fields: &[&str],
    ) -> Result<Action, KeyError> {
        super::canonical::check_value(args)?;
        let ids = pick_ids(args, fields)?;
        let identity = fingerprint_of(&ids)?;
        let mut material = match ids {
            serde_json::Value::Object(ids) => ids,
            _ => serde_json::Map::new(),
        };
        if let Some(object) = args.as_object() {
            for (k, v) in object {
                if (v.is_number() || v.is_boolean()) && !material.contains_key(k) {
                    material.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(Action {
            key: IdempotencyKey::from_hash(run, step, tool, &identity)?,
            fingerprint: fingerprint_of(&serde_json::Value::Object(material))?,
        })
    }

    /// An action known by its run, step and tool alone (a tool declared with no argument field
    /// in its key): the key covers none of `args`, the fingerprint all of them, so a repeat with
    /// other arguments is told apart, never taken for the same action.
    pub(crate) fn of_identity(
        run: &str,
        step: &str,
        tool: &str,
        args: &serde_json::Value,
    ) -> Result<Action, KeyError> {
        Ok(Action {
            key: IdempotencyKey::derive(run, step, tool, &serde_json::Value::Null)?,
            fingerprint: fingerprint_of(args)?,
        })
    }

    /// An action known only by a key made elsewhere (for example read from a trusted header):
    /// its fingerprint is the key's own, so a repeat can never be told apart by its arguments.
    ///
    /// ```
    /// use stormguard::key::{Action, IdempotencyKey};
    /// let key = IdempotencyKey::parse("order-7:charge")?;
    /// assert_eq!(Action::from_key(key.clone()).key(), &key);
    /// # Ok::<(), stormguard::key::KeyError>(())
    /// ```
    pub fn from_key(key: IdempotencyKey) -> Action {
        let fingerprint = format!("key:{:016x}", key.fingerprint());
        Action { key, fingerprint }
    }

    /// The idempotency key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The idempotency key, by value.
    pub fn into_key(self) -> IdempotencyKey {
        self.key
    }

    /// The fingerprint of the material arguments.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

#[cfg(test)]
mod value_tests {
    use super::Action;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z0-9 é\\\"]{0,8}".prop_map(Value::from),
        ]
    }

    proptest! {
        /// A declared tool's action from its JSON arguments is the one `Action::task` makes with
        /// its key fields as the identity and those, the numbers and the booleans as the material.
        #[test]
        fn task_value_is_task(id in leaf(), other in leaf(), nested in proptest::collection::vec(leaf(), 0..4)) {
            let args = json!({ "id": id, "other": other, "nested": nested });
            for fields in [&["id"][..], &["id", "nested"][..], &["other", "id"][..]] {
                let a = Action::task_value("run-1", "-", "t", &args, fields);
                let scalars = ["id", "other"].into_iter().filter(|f| args[*f].is_number() || args[*f].is_boolean());
                let mut material: Vec<&str> = fields.to_vec();
                material.extend(scalars.filter(|f| !fields.contains(f)));
                let b = Action::task("run-1", "-", "t", &args, fields, &material);
                prop_assert_eq!(a, b);
            }
        }
    }
}
