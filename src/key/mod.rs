//! Idempotency keys derived from an action's logical identity: run, step, tool and arguments.
//!
//! Every retry of one logical action must carry the same key, or the key does nothing; a fresh
//! random key per attempt looks diligent and defeats the point. [`IdempotencyKey::derive`] makes
//! the key from what identifies the action, so the same action gives the same key in every
//! process, on every machine, after any crash:
//!
//! ```text
//! run-81f2:step-2:send_invoice:3f1c9a0be2d54c77a1e0f3b2c4d5e6f7
//! ```
//!
//! The arguments are canonicalised as RFC 8785 says (the JSON Canonicalization Scheme: members
//! sorted, no insignificant whitespace, every number in one ECMAScript form, integers exact; see
//! [`canonical_json`]) and hashed with SHA-256; only the hash appears in the key, never a raw
//! argument value (they may be secret). The key is at most 255 bytes (Stripe's limit).
//!
//! **Task-shaped tools.** A model that regenerates a free-text field (an email body) on every
//! attempt would change the hash. Name the fields that identify the action with
//! [`IdempotencyKey::derive_fields`]: the key covers those, so a reworded body is the same action.
//!
//! ```
//! use serde_json::json;
//! use stormguard::key::IdempotencyKey;
//!
//! let a = IdempotencyKey::derive("run-81f2", "step-2", "send_invoice", &json!({"invoice_id": 4471, "to": "a@b.c"}))?;
//! let b = IdempotencyKey::derive("run-81f2", "step-2", "send_invoice", &json!({"to": "a@b.c", "invoice_id": 4471}))?;
//! assert_eq!(a, b); // argument order does not matter
//! assert!(a.as_str().starts_with("run-81f2:step-2:send_invoice:"));
//! assert!(!a.as_str().contains("a@b.c")); // no raw values
//!
//! let body1 = json!({"invoice_id": 4471, "body": "Dear customer, ..."});
//! let body2 = json!({"invoice_id": 4471, "body": "Hello! Here is ..."});
//! assert_eq!(
//!     IdempotencyKey::derive_fields("run-81f2", "step-2", "send_invoice", &body1, &["invoice_id"])?,
//!     IdempotencyKey::derive_fields("run-81f2", "step-2", "send_invoice", &body2, &["invoice_id"])?,
//! );
//! # Ok::<(), stormguard::key::KeyError>(())
//! ```

mod action;
mod canonical;
pub mod future;
mod layer;
#[cfg(feature = "rmcp")]
mod mcp;
mod number;

pub(crate) use action::normalized_id;
pub use action::Action;
use canonical::to_value;
pub use canonical::{canonical_json, MAX_DEPTH};
pub(crate) use layer::check_stamped;
pub use layer::{KeyStamp, MakeIdempotencyKey, SetIdempotencyKey, SetIdempotencyKeyLayer};
#[cfg(feature = "rmcp")]
pub use mcp::{mcp_request_key, MCP_KEY_META};
pub use number::es_number;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;

/// The longest identifier part (run, step or tool) accepted.
///
/// ```
/// use stormguard::key::{IdempotencyKey, MAX_PART};
///
/// let long = "s".repeat(MAX_PART + 1);
/// let err = IdempotencyKey::derive("run-1", &long, "send", &1).unwrap_err();
/// assert_eq!(err.part(), "step");
/// assert!(IdempotencyKey::derive("run-1", &long[..MAX_PART], "send", &1).is_ok());
/// ```
pub const MAX_PART: usize = 64;

/// An idempotency key: `run:step:tool:hash`, at most 255 bytes, safe to send in a header.
///
/// The hash is SHA-256 of the canonical JSON of the arguments, so the same logical action gets
/// the same key in every process, whatever the order of its fields, and no argument value
/// appears in the key.
///
/// ```
/// use serde_json::json;
/// use stormguard::key::IdempotencyKey;
///
/// let a = IdempotencyKey::derive("run-81f2", "step-2", "send_invoice",
///     &json!({ "invoice": 4471, "to": "ap@example.com" })).unwrap();
/// let b = IdempotencyKey::derive("run-81f2", "step-2", "send_invoice",
///     &json!({ "to": "ap@example.com", "invoice": 4471 })).unwrap();
/// assert_eq!(a, b);
/// assert!(a.as_str().starts_with("run-81f2:step-2:send_invoice:"));
/// assert!(!a.as_str().contains("example.com"));
/// assert_eq!(IdempotencyKey::parse(a.as_str()).unwrap(), a);
///
/// // Read back from a checkpoint, a key is checked as `parse` checks it.
/// let back: IdempotencyKey = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
/// assert_eq!(back, a);
/// assert!(serde_json::from_str::<IdempotencyKey>("\"run 1:step\\n2\"").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> String {
        key.0
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = KeyError;

    fn try_from(key: String) -> Result<Self, KeyError> {
        IdempotencyKey::parse(&key)
    }
}

/// Why a key could not be made.
///
/// ```
/// use stormguard::key::IdempotencyKey;
///
/// let err = IdempotencyKey::derive("run 1", "step-2", "send", &()).unwrap_err();
/// assert_eq!(err.part(), "run");
/// assert!(err.to_string().contains("ASCII letters"));
/// assert_eq!(IdempotencyKey::parse("").unwrap_err().part(), "key");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    part: &'static str,
    reason: &'static str,
}

impl KeyError {
    pub(crate) const fn new(part: &'static str, reason: &'static str) -> Self {
        KeyError { part, reason }
    }

    /// The part that was rejected (`run`, `step`, `tool`, `args` or `key`).
    pub fn part(&self) -> &'static str {
        self.part
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid idempotency key {}: {}", self.part, self.reason)
    }
}

impl std::error::Error for KeyError {}

/// The first 16 bytes of `digest` in lower-case hex (32 characters, one allocation).
pub(crate) fn hex16(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(32);
    for b in digest.iter().take(16) {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    hex
}

/// The digest of `args` in RFC 8785 form, as a key's and a fingerprint's hex.
pub(crate) fn digest_hex(args: &Value) -> Result<String, KeyError> {
    Ok(hex16(&Sha256::digest(canonical_json(args)?.as_bytes())))
}

fn check_part(part: &'static str, value: &str) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError {
            part,
            reason: "must not be empty",
        });
    }
    if value.len() > MAX_PART {
        return Err(KeyError {
            part,
            reason: "must be at most 64 bytes",
        });
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(KeyError {
            part,
            reason: "may hold only ASCII letters, digits, '-', '_' and '.'",
        });
    }
    Ok(())
}

impl IdempotencyKey {
    /// The key of the action `tool(args)` at `step` of `run`, covering all of `args`.
    pub fn derive(
        run: &str,
        step: &str,
        tool: &str,
        args: &impl Serialize,
    ) -> Result<IdempotencyKey, KeyError> {
        let value = to_value(args)?;
        Self::from_value(run, step, tool, &value)
    }

    /// The key covering only the named top-level fields of `args`: for task-shaped tools whose
    /// other fields (free text) may be reworded. `args` must be a JSON object holding every named
    /// field (a field that is there with the value `null` counts); a missing or misspelled field
    /// is an error, never `null`, so two actions that lack it cannot share a key. The fields are
    /// identifiers, read as such: a string holding an integer is that integer and surrounding
    /// whitespace is dropped, so the model writing `"4471"` one time and `4471` the next is one
    /// action, not two.
    ///
    /// ```
    /// use serde_json::json;
    /// use stormguard::key::IdempotencyKey;
    ///
    /// let args = json!({"invoice_id": 4471, "body": "Dear customer"});
    /// let key = IdempotencyKey::derive_fields("run-1", "step-2", "send", &args, &["invoice_id"]).unwrap();
    /// let drifted = json!({"invoice_id": " 4471", "body": "Hello"});
    /// assert_eq!(IdempotencyKey::derive_fields("run-1", "step-2", "send", &drifted, &["invoice_id"]).unwrap(), key);
    /// let err = IdempotencyKey::derive_fields("run-1", "step-2", "send", &args, &["invoice"]).unwrap_err();
    /// assert_eq!(err.part(), "args");
    /// assert!(IdempotencyKey::derive_fields("run-1", "step-2", "send", &4471, &["invoice_id"]).is_err());
    /// ```
    pub fn derive_fields(
        run: &str,
        step: &str,
        tool: &str,
        args: &impl Serialize,
        fields: &[&str],
    ) -> Result<IdempotencyKey, KeyError> {
        let value = to_value(args)?;
        Self::from_value(run, step, tool, &action::pick_ids(&value, fields)?)
    }

    /// Wraps a key made elsewhere (for example read back from a header): 1 to 255 bytes of
    /// visible ASCII.
    pub fn parse(key: &str) -> Result<IdempotencyKey, KeyError> {
        if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError {
                part: "key",
                reason: "must be 1 to 255 bytes of visible ASCII",
            });
        }
        Ok(IdempotencyKey(key.to_string()))
    }

    fn from_value(run: &str, step: &str, tool: &str, args: &Value) -> Result<Self, KeyError> {
        Self::from_hash(run, step, tool, &digest_hex(args)?)
    }

    /// The key of `run`, `step`, `tool` and the arguments whose [`digest_hex`] is `hash`: one
    /// allocation.
    pub(crate) fn from_hash(
        run: &str,
        step: &str,
        tool: &str,
        hash: &str,
    ) -> Result<Self, KeyError> {
        check_part("run", run)?;
        check_part("step", step)?;
        check_part("tool", tool)?;
        let mut key = String::with_capacity(run.len() + step.len() + tool.len() + hash.len() + 3);
        for part in [run, ":", step, ":", tool, ":", hash] {
            key.push_str(part);
        }
        Ok(IdempotencyKey(key))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A 64-bit fingerprint (never 0), for cheap comparisons.
    pub fn fingerprint(&self) -> u64 {
        let digest = Sha256::digest(self.0.as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(bytes).max(1)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
