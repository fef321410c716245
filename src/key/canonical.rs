//! The canonical JSON a key and a fingerprint hash: RFC 8785 (the JSON Canonicalization Scheme),
//! made independent of serde_json's features.
//!
//! - Object members sorted by the UTF-16 code units of their names; no insignificant whitespace;
//!   strings escaped as RFC 8785 says (`"`, `\`, the short escapes, other controls as `\u00xx`).
//! - A float is written in the ECMAScript form RFC 8785 prescribes (the shortest digits that
//!   read back as the same double): `1.0` and `1` are one number, `1e16` is
//!   `10000000000000000`, `1e21` is `1e+21`, `-0` is `0`. Integers serde holds as `i64`/`u64`
//!   are written exactly (RFC 8785 would round one above 2^53 to a double; two ids that differ
//!   there must not share a key). With serde_json's `arbitrary_precision` on, `0.1`, `0.10` and
//!   `1e-1` are one number as well.
//! - NaN and the infinities are refused (serde_json would write them as `null`, colliding with
//!   `None`), and so is a value nested deeper than [`MAX_DEPTH`].
//! - Strings are compared as given, code point by code point: the NFC and NFD forms of "é" are
//!   two strings and give two keys (RFC 8785 does not normalise). Normalise text that may arrive
//!   in either form before it reaches a key, or leave it out of the identity fields.
//!
//! This crate turns on serde_json's `float_roundtrip`, so a float saved as JSON (by serde_json,
//! anywhere in the build) and read back is the same double, and the key is computed from the
//! JSON text the arguments serialise to (an `f32` included), so it is the same before and after
//! a save-and-reload.

use super::number::es_number;
use super::KeyError;
use serde::ser::{self, Serialize};
use serde_json::{Number, Value};
use std::fmt;

/// The deepest nesting of arrays and objects a key's arguments may have.
///
/// ```
/// use serde_json::{json, Value};
/// use stormguard::key::{IdempotencyKey, MAX_DEPTH};
///
/// let mut deep = json!(1);
/// for _ in 0..MAX_DEPTH + 1 {
///     deep = Value::Array(vec![deep]);
/// }
/// let err = IdempotencyKey::derive("run-1", "step-2", "send", &deep).unwrap_err();
/// assert_eq!(err.part(), "args");
/// # std::mem::forget(deep); // a deep value's own drop recurses; not the point here
/// ```
pub const MAX_DEPTH: usize = 128;

/// The canonical JSON text of `value` (RFC 8785, integers exact; see the
/// [module docs](crate::key)).
///
/// ```
/// use serde_json::json;
/// use stormguard::key::canonical_json;
///
/// assert_eq!(canonical_json(&json!({"b": 1.0, "a": [true, null]}))?, r#"{"a":[true,null],"b":1}"#);
/// assert_eq!(canonical_json(&json!([1e16, 1e21, 0.000001, 1e-7, -0.0]))?, "[10000000000000000,1e+21,0.000001,1e-7,0]");
/// # Ok::<(), stormguard::key::KeyError>(())
/// ```
pub fn canonical_json(value: &Value) -> Result<String, KeyError> {
    let mut out = String::new();
    write(value, &mut out, 0)?;
    Ok(out)
}

fn too_deep() -> KeyError {
    KeyError::new("args", "are nested deeper than MAX_DEPTH (128)")
}

fn write(value: &Value, out: &mut String, depth: usize) -> Result<(), KeyError> {
    match value {
        Value::Object(map) => {
            if depth >= MAX_DEPTH {
                return Err(too_deep());
            }
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write(v, out, depth + 1)?;
            }
            out.push('}');
        }
        Value::Array(items) => {
            if depth >= MAX_DEPTH {
                return Err(too_deep());
            }
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(v, out, depth + 1)?;
            }
            out.push(']');
        }
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("null"),
    }
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(n: &Number, out: &mut String) -> Result<(), KeyError> {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else {
        match n.as_f64() {
            Some(f) if f.is_finite() => out.push_str(&es_number(f)),
            _ => return Err(KeyError::new("args", "hold a number that is not finite")),
        }
    }
    Ok(())
}

/// `args` as a JSON value, after checking (without building anything) that it holds no
/// non-finite float and is nested at most [`MAX_DEPTH`] deep: serde_json would write such a
/// float as `null`, and a deeper value would exhaust the stack.
///
/// The value is read from the JSON text `args` serialises to, as a checkpoint saved and read
/// back would be: serde_json writes an `f32` as its own shortest digits (`0.1`) but
/// `serde_json::to_value` widens it to the double `0.10000000149011612`, so only the text gives
/// one key before and after a save-and-reload.
/// What [`to_value`] checks of arguments that are JSON already (their depth): a `Value` read back
/// from its own text is itself, so only the check is left to make.
pub(crate) fn check_value(args: &Value) -> Result<(), KeyError> {
    args.serialize(Check { depth: 0 }).map_err(|e| e.0)
}

pub(crate) fn to_value(args: &impl Serialize) -> Result<Value, KeyError> {
    args.serialize(Check { depth: 0 }).map_err(|e| e.0)?;
    let unserialisable = |_| KeyError::new("args", "could not be serialised to JSON");
    let text = serde_json::to_string(args).map_err(unserialisable)?;
    serde_json::from_str(&text).map_err(unserialisable)
}

#[derive(Debug)]
struct CheckError(KeyError);

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CheckError {}

impl ser::Error for CheckError {
    fn custom<T: fmt::Display>(_: T) -> Self {
        CheckError(KeyError::new("args", "could not be serialised to JSON"))
    }
}

/// A serializer that builds nothing: it only walks the value, checking floats and depth.
#[derive(Clone, Copy)]
struct Check {
    depth: usize,
}

impl Check {
    fn nest(self) -> Result<Check, CheckError> {
        if self.depth >= MAX_DEPTH {
            return Err(CheckError(too_deep()));
        }
        Ok(Check {
            depth: self.depth + 1,
        })
    }

    fn float(self, f: f64) -> Result<(), CheckError> {
        if f.is_finite() {
            Ok(())
        } else {
            Err(CheckError(KeyError::new(
                "args",
                "hold a number that is not finite (NaN or an infinity)",
            )))
        }
    }
}

/// An integer beyond 64 bits would be read back as a double: two ids could share a key.
fn wide(fits: bool) -> Result<(), CheckError> {
    if fits {
        Ok(())
    } else {
        Err(CheckError(KeyError::new(
            "args",
            "hold an integer beyond 64 bits; pass it as a string",
        )))
    }
}

macro_rules! fine {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name(self, _: $ty) -> Result<(), CheckError> { Ok(()) })*
    };
}

impl ser::Serializer for Check {
    type Ok = ();
    type Error = CheckError;
    type SerializeSeq = Check;
    type SerializeTuple = Check;
    type SerializeTupleStruct = Check;
    type SerializeTupleVariant = Check;
    type SerializeMap = Check;
    type SerializeStruct = Check;
    type SerializeStructVariant = Check;

    fine!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_char: char, serialize_str: &str, serialize_bytes: &[u8]);

    fn serialize_i128(self, v: i128) -> Result<(), CheckError> {
        wide(i64::try_from(v).is_ok() || u64::try_from(v).is_ok())
    }
    fn serialize_u128(self, v: u128) -> Result<(), CheckError> {
        wide(u64::try_from(v).is_ok())
    }

    fn serialize_f32(self, v: f32) -> Result<(), CheckError> {
        self.float(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), CheckError> {
        self.float(v)
    }
    fn serialize_none(self) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<(), CheckError> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), CheckError> {
        Ok(())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), CheckError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), CheckError> {
        v.serialize(self.nest()?)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Check, CheckError> {
        self.nest()
    }
    fn serialize_tuple(self, _: usize) -> Result<Check, CheckError> {
        self.nest()
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Check, CheckError> {
        self.nest()
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Check, CheckError> {
        self.nest()?.nest()
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Check, CheckError> {
        self.nest()
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Check, CheckError> {
        self.nest()
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Check, CheckError> {
        self.nest()?.nest()
    }
}

macro_rules! compound {
    ($($trait:ident :: $method:ident),*) => {
        $(impl ser::$trait for Check {
            type Ok = ();
            type Error = CheckError;
            fn $method<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), CheckError> {
                v.serialize(*self)
            }
            fn end(self) -> Result<(), CheckError> {
                Ok(())
            }
        })*
    };
}

compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Check {
    type Ok = ();
    type Error = CheckError;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, k: &T) -> Result<(), CheckError> {
        k.serialize(*self)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), CheckError> {
        v.serialize(*self)
    }
    fn end(self) -> Result<(), CheckError> {
        Ok(())
    }
}

macro_rules! fields {
    ($($trait:ident),*) => {
        $(impl ser::$trait for Check {
            type Ok = ();
            type Error = CheckError;
            fn serialize_field<T: ?Sized + Serialize>(
                &mut self,
                _: &'static str,
                v: &T,
            ) -> Result<(), CheckError> {
                v.serialize(*self)
            }
            fn end(self) -> Result<(), CheckError> {
                Ok(())
            }
        })*
    };
}

fields!(SerializeStruct, SerializeStructVariant);
