//! Reading the JSON shape back: [`ToolError::from_json`] and serde's `Deserialize`, both bounded
//! in depth so that no value, however deep, exhausts the stack.

use super::{ErrorCode, FailureClass, ToolError};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;
use std::time::Duration;

/// The most `cause` levels [`ToolError::from_json`] reads below the top-level error; deeper
/// causes are cut off (the shape [`to_json`](ToolError::to_json) writes has one).
///
/// A chain of causes is read without recursion, so a value nested thousands of levels deep
/// costs no stack; the bound keeps the error that comes back small.
///
/// ```
/// use serde_json::json;
/// use stormguard::error::{ErrorCode, ToolError, MAX_CAUSE_DEPTH};
///
/// let mut value = json!({"code": "timeout"});
/// for _ in 0..MAX_CAUSE_DEPTH + 10 {
///     value = json!({"code": "internal", "cause": value});
/// }
/// let err = ToolError::from_json(&value).unwrap();
/// let mut depth = 0;
/// let mut next = err.cause();
/// while let Some(cause) = next {
///     depth += 1;
///     next = cause.cause();
/// }
/// assert_eq!(depth, MAX_CAUSE_DEPTH);
/// ```
pub const MAX_CAUSE_DEPTH: usize = 32;

/// The deepest nesting of arrays and objects serde's `Deserialize` for [`ToolError`] reads
/// (serde_json's own parser stops at the same depth); a deeper value is an error, whatever the
/// deserializer (a `serde_json::Value` built in memory has no depth limit of its own).
///
/// ```
/// use serde_json::{json, Value};
/// use stormguard::error::{ToolError, MAX_JSON_DEPTH};
///
/// let mut deep = json!(1);
/// for _ in 0..MAX_JSON_DEPTH {
///     deep = Value::Array(vec![deep]);
/// }
/// let err = serde_json::from_value::<ToolError>(json!({"code": "internal", "extra": deep})).unwrap_err();
/// assert!(err.to_string().contains("nested deeper"));
/// ```
pub const MAX_JSON_DEPTH: usize = 128;

impl ToolError {
    /// Reads the JSON shape back ([`to_json`](Self::to_json)'s), as a client does with a tool's
    /// error (an MCP result, a tool server's answer): `code` is required and must be a known
    /// code; `retryable` defaults to the code's, `hint` to the code's; `retry_after_ms`,
    /// `attempts`, `class` and `cause` are read when present, and must have their types when
    /// present (a `retry_after_ms` of `1.5` or a `retryable` of `"yes"` is not this shape).
    /// `None` for anything else, so a caller can tell "a stormguard error" from "some JSON".
    ///
    /// A `cause` is read the same way, down to [`MAX_CAUSE_DEPTH`] levels; deeper ones are cut
    /// off, unread. Other fields are never walked, so no value exhausts the stack.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::error::{ErrorCode, ToolError};
    ///
    /// let sent = ToolError::new(ErrorCode::RateLimited).with_retry_after(Duration::from_millis(1500));
    /// let back = ToolError::from_json(&sent.to_json()).unwrap();
    /// assert_eq!((back.code(), back.retryable()), (ErrorCode::RateLimited, true));
    /// assert_eq!(back.retry_after(), Some(Duration::from_millis(1500)));
    /// assert!(ToolError::from_json(&serde_json::json!({"code": "no_such_code"})).is_none());
    /// // And with serde.
    /// let back: ToolError = serde_json::from_value(sent.to_json()).unwrap();
    /// assert_eq!(back.to_json(), sent.to_json());
    /// ```
    pub fn from_json(value: &Value) -> Option<ToolError> {
        // The chain of values, top first, walked in a loop (no recursion).
        let mut levels = vec![value];
        while levels.len() <= MAX_CAUSE_DEPTH {
            match present(levels[levels.len() - 1], "cause") {
                Some(cause) => levels.push(cause),
                None => break,
            }
        }
        // Built from the deepest up, each one the source of the one above.
        let mut below: Option<ToolError> = None;
        for level in levels.into_iter().rev() {
            let err = one_level(level)?;
            below = Some(match below {
                Some(cause) => err.with_source(cause),
                None => err,
            });
        }
        below
    }

    /// Whether `value` carries the whole shape [`to_json`](Self::to_json) writes (`code`,
    /// `retryable` and `hint`), not just a field named `code` (another server's error JSON).
    #[cfg(feature = "rmcp")]
    pub(crate) fn is_whole_shape(value: &Value) -> bool {
        value.get("retryable").is_some_and(|v| v.is_boolean())
            && value.get("hint").is_some_and(|v| v.is_string())
    }
}

/// A field that is present and not `null`.
fn present<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    value.get(name).filter(|v| !v.is_null())
}

/// One level of the shape, its `cause` aside.
fn one_level(value: &Value) -> Option<ToolError> {
    let code = ErrorCode::parse(value.get("code")?.as_str()?)?;
    let mut err = ToolError::new(code);
    // A field that is present must have its type: a wrong one is not this shape at all.
    if let Some(v) = present(value, "retryable") {
        err = err.with_retryable(v.as_bool()?);
    }
    if let Some(v) = present(value, "hint") {
        err = err.with_hint(v.as_str()?.to_string());
    }
    if let Some(v) = present(value, "retry_after_ms") {
        err = err.with_retry_after(Duration::from_millis(v.as_u64()?));
    }
    if let Some(v) = present(value, "attempts") {
        err = err.with_attempts(u32::try_from(v.as_u64()?).ok()?);
    }
    if let Some(v) = present(value, "class") {
        err = err.with_class(serde_json::from_value::<FailureClass>(v.clone()).ok()?);
    }
    Some(err)
}

impl<'de> serde::Deserialize<'de> for ToolError {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = deserializer.deserialize_any(Bounded { depth: 0 })?;
        ToolError::from_json(&value)
            .ok_or_else(|| de::Error::custom("not a stormguard ToolError (no known `code`)"))
    }
}

/// A `serde_json::Value`, read at most [`MAX_JSON_DEPTH`] levels deep.
#[derive(Clone, Copy)]
struct Bounded {
    depth: usize,
}

impl Bounded {
    fn nest<E: de::Error>(self) -> Result<Bounded, E> {
        if self.depth >= MAX_JSON_DEPTH {
            return Err(E::custom(format_args!(
                "not a stormguard ToolError: nested deeper than {MAX_JSON_DEPTH} levels"
            )));
        }
        Ok(Bounded {
            depth: self.depth + 1,
        })
    }
}

impl<'de> de::DeserializeSeed<'de> for Bounded {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.nest()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Value::Object(Map::new()));
        };
        if first == NUMBER_TOKEN {
            // serde_json with `arbitrary_precision` (on anywhere in the build) hands a number
            // over as a one-member map of its digits, as `serde_json::Value` reads it.
            let digits = map.next_value::<String>()?;
            return digits
                .parse::<serde_json::Number>()
                .map(Value::Number)
                .map_err(de::Error::custom);
        }
        let inner = self.nest()?;
        let mut members = Map::new();
        let mut key = Some(first);
        while let Some(k) = key {
            let v = map.next_value_seed(inner)?;
            members.insert(k, v);
            key = map.next_key::<String>()?;
        }
        Ok(Value::Object(members))
    }
}

/// The key serde_json's `arbitrary_precision` wraps a number's digits in.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::value::{Error, MapDeserializer};
    use serde::de::Visitor;

    #[test]
    fn a_number_in_arbitrary_precision_form_is_a_number() {
        let map = MapDeserializer::<_, Error>::new([(NUMBER_TOKEN, "1500")].into_iter());
        let value = Bounded {
            depth: MAX_JSON_DEPTH,
        }
        .visit_map(map)
        .unwrap();
        assert_eq!(value, Value::from(1500u64));
        let map = MapDeserializer::<_, Error>::new([("a", "b")].into_iter());
        assert!(Bounded {
            depth: MAX_JSON_DEPTH
        }
        .visit_map(map)
        .is_err());
        let map = MapDeserializer::<_, Error>::new([("a", "b")].into_iter());
        let value = Bounded { depth: 0 }.visit_map(map).unwrap();
        assert_eq!(value, serde_json::json!({"a": "b"}));
    }
}
