//! The idempotency key on an MCP `tools/call` (feature `rmcp`): in the request's `_meta`, under
//! [`MCP_KEY_META`], until the protocol has a field of its own.

use super::{IdempotencyKey, KeyStamp};
use rmcp::model::CallToolRequestParams;
use serde_json::Value;

/// The `_meta` key an idempotency key travels under on an MCP `tools/call`: a tool server reads
/// it back with [`KeyStamp::stamped_key`] (or `params.meta["io.stormguard/idempotency-key"]`)
/// and keys its receipts or its provider's call on it.
///
/// ```
/// use rmcp::model::CallToolRequestParams;
/// use stormguard::key::{IdempotencyKey, KeyStamp, MCP_KEY_META};
///
/// let key = IdempotencyKey::derive("run-1", "step-2", "send_invoice", &4471).unwrap();
/// let mut params = CallToolRequestParams::new("send_invoice");
/// assert_eq!(params.stamped_key(), None);
/// params.stamp_key(&key);
/// assert_eq!(params.stamped_key(), Some(key.as_str()));
/// let wire = serde_json::to_value(&params).unwrap();
/// assert_eq!(wire["_meta"][MCP_KEY_META], key.as_str());
/// ```
pub const MCP_KEY_META: &str = "io.stormguard/idempotency-key";

impl KeyStamp for CallToolRequestParams {
    fn stamped_key(&self) -> Option<&str> {
        self.meta.as_ref()?.0 .0.get(MCP_KEY_META)?.as_str()
    }

    fn carries_unreadable_key(&self) -> bool {
        // Present but not a key (a number, a malformed string): refused, never replaced.
        self.meta
            .as_ref()
            .and_then(|m| m.0 .0.get(MCP_KEY_META))
            .is_some_and(|v| v.as_str().is_none_or(|k| IdempotencyKey::parse(k).is_err()))
    }

    fn stamp_key(&mut self, key: &IdempotencyKey) {
        let meta = self.meta.get_or_insert_with(Default::default);
        meta.0 .0.insert(
            MCP_KEY_META.to_owned(),
            Value::String(key.as_str().to_owned()),
        );
    }
}

/// The idempotency key a `tools/call` carried, as a tool server built on rmcp sees it: its
/// handler takes the request's `_meta` (`meta: RequestMetaObject` as an argument) and reads the
/// key here, to key its receipts or its provider's call on it.
///
/// ```
/// use rmcp::model::{CallToolRequestParams, RequestMetaObject};
/// use stormguard::key::{mcp_request_key, IdempotencyKey, KeyStamp};
///
/// let key = IdempotencyKey::derive("run-1", "step-2", "send_invoice", &4471).unwrap();
/// let mut params = CallToolRequestParams::new("send_invoice");
/// params.stamp_key(&key);
/// let meta: RequestMetaObject = params.meta.unwrap();
/// assert_eq!(mcp_request_key(&meta), Some(key.as_str()));
/// assert_eq!(mcp_request_key(&RequestMetaObject::default()), None);
/// ```
pub fn mcp_request_key(meta: &rmcp::model::RequestMetaObject) -> Option<&str> {
    meta.0 .0.get(MCP_KEY_META)?.as_str()
}
