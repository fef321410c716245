//! What a model API's error body says ([`ErrorBody`]), read from whole JSON or from as much of
//! it as a peek could read.

/// What an error response's body said, as far as a model API's error shape tells (OpenAI:
/// `{"error": {"type", "code", "message"}}`; Anthropic: `{"type": "error", "error": {"type",
/// "message"}}`). Put in the response's extensions by [`PeekErrorBody`](super::PeekErrorBody); read by
/// [`ModelApiClassifier`](crate::classify::ModelApiClassifier).
///
/// ```
/// use stormguard::peek::ErrorBody;
///
/// let openai = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
/// let e = ErrorBody::parse(openai);
/// assert_eq!(e.kind.as_deref(), Some("insufficient_quota"));
/// assert_eq!(e.code.as_deref(), Some("insufficient_quota"));
///
/// let anthropic = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
/// assert_eq!(ErrorBody::parse(anthropic).kind.as_deref(), Some("overloaded_error"));
/// assert_eq!(ErrorBody::parse(b"<html>502</html>"), ErrorBody::default());
///
/// // A body cut at the peek's limit is read as far as it goes: whole values count.
/// let cut = br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exc"#;
/// let e = ErrorBody::parse(cut);
/// assert!(e.is("insufficient_quota"));
/// assert_eq!(e.message, None); // cut inside the value: not guessed
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorBody {
    /// `error.type`.
    pub kind: Option<String>,
    /// `error.code` (a string, or a number written as text).
    pub code: Option<String>,
    /// `error.message`, cut to 300 characters.
    pub message: Option<String>,
    /// The body was longer than the peek's limit, did not arrive within its timeout, or broke
    /// (the caller gets its error where it came): what was read is all that was parsed.
    pub truncated: bool,
}

impl ErrorBody {
    /// Reads the error shape from a body; fields it does not find are `None`. A body that is not
    /// whole JSON (cut at the peek's limit, or broken off) is read as far as it goes: a value
    /// counts only if it is whole (a string with its closing quote, a number followed by a
    /// delimiter), so a quota error whose `type` comes before a long `message` is still told.
    pub fn parse(bytes: &[u8]) -> ErrorBody {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(value) => Self::from_value(&value),
            Err(e) if e.is_eof() => scan_prefix(bytes),
            Err(_) => ErrorBody::default(),
        }
    }

    fn from_value(value: &serde_json::Value) -> ErrorBody {
        let Some(error) = value.get("error") else {
            return ErrorBody::default();
        };
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let mut body = ErrorBody::default();
        for field in ["type", "code", "message"] {
            if let Some(v) = error.get(field).and_then(text) {
                body.set(field, v);
            }
        }
        body
    }

    fn set(&mut self, field: &str, value: String) {
        match field {
            "type" => self.kind = Some(value),
            "code" => self.code = Some(value),
            "message" => self.message = Some(value.chars().take(300).collect()),
            _ => {}
        }
    }

    /// Whether `error.type` or `error.code` is `what`.
    pub fn is(&self, what: &str) -> bool {
        self.kind.as_deref() == Some(what) || self.code.as_deref() == Some(what)
    }
}

/// One open container of the JSON text being scanned.
enum Open {
    /// An object, with the key whose value comes next (if one has been read).
    Object {
        key: Option<String>,
    },
    Array,
}

/// Reads `error.type`, `error.code` and `error.message` from the start of a JSON text that ends
/// early. Whole values only; anything that is not JSON stops the scan with what was found.
fn scan_prefix(bytes: &[u8]) -> ErrorBody {
    let mut body = ErrorBody::default();
    let mut stack: Vec<Open> = Vec::new();
    // The depth of the `error` object, once inside it.
    let mut error_depth = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b' ' | b'\t' | b'\n' | b'\r' | b':' => i += 1,
            b',' => {
                if let Some(Open::Object { key }) = stack.last_mut() {
                    *key = None;
                }
                i += 1;
            }
            b'{' | b'[' => {
                let is_error = stack.len() == 1
                    && matches!(stack.last(), Some(Open::Object { key: Some(k) }) if k == "error");
                stack.push(if b == b'{' {
                    Open::Object { key: None }
                } else {
                    Open::Array
                });
                if is_error && b == b'{' {
                    error_depth = Some(stack.len());
                }
                i += 1;
            }
            b'}' | b']' => {
                if error_depth == Some(stack.len()) {
                    return body; // the error object is whole: nothing more to learn
                }
                stack.pop();
                i += 1;
            }
            b'"' => {
                let Some(end) = string_end(bytes, i) else {
                    return body;
                };
                let Ok(s) = serde_json::from_slice::<String>(&bytes[i..end]) else {
                    return body;
                };
                i = end;
                let in_error = error_depth == Some(stack.len());
                match stack.last_mut() {
                    Some(Open::Object { key }) if key.is_none() => *key = Some(s),
                    Some(Open::Object { key: Some(k) }) if in_error => {
                        let field = k.clone();
                        body.set(&field, s);
                    }
                    _ => {}
                }
            }
            _ => {
                // A number or a literal: whole only if a delimiter follows it.
                let end = i + bytes[i..]
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                    .unwrap_or(bytes.len() - i);
                if end == bytes.len() {
                    return body;
                }
                let Ok(token) = std::str::from_utf8(&bytes[i..end]) else {
                    return body;
                };
                if token.parse::<f64>().is_err() && !matches!(token, "true" | "false" | "null") {
                    return body; // not JSON
                }
                if let (Some(Open::Object { key: Some(k) }), true) =
                    (stack.last(), error_depth == Some(stack.len()))
                {
                    if k == "code" && token.parse::<f64>().is_ok() {
                        body.code = Some(token.to_string());
                    }
                }
                i = end;
            }
        }
    }
    body
}

/// The index just past the closing quote of the string starting at `start`, if it is whole.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WHOLE: &str = r#"{"type":"error","error":{"type":"overloaded_error","code":529,"message":"Over \"loaded\"","param":[1,{"a":"b"}]},"request_id":"req_1"}"#;

    #[test]
    fn every_cut_of_a_body_reads_no_more_than_the_whole_and_nothing_false() {
        let whole = ErrorBody::parse(WHOLE.as_bytes());
        assert_eq!(whole.kind.as_deref(), Some("overloaded_error"));
        assert_eq!(whole.code.as_deref(), Some("529"));
        assert_eq!(whole.message.as_deref(), Some("Over \"loaded\""));
        for cut in 0..WHOLE.len() {
            let part = ErrorBody::parse(&WHOLE.as_bytes()[..cut]);
            for (got, want) in [
                (&part.kind, &whole.kind),
                (&part.code, &whole.code),
                (&part.message, &whole.message),
            ] {
                assert!(got.is_none() || got == want, "cut at {cut}: {part:?}");
            }
        }
        // Cut just after the type's closing quote: the type is known.
        let at = WHOLE.find("overloaded_error").unwrap() + "overloaded_error\"".len();
        assert!(ErrorBody::parse(&WHOLE.as_bytes()[..at]).is("overloaded_error"));
    }

    #[test]
    fn a_cut_outside_the_error_object_or_not_json_reads_nothing() {
        assert_eq!(
            ErrorBody::parse(br#"{"type":"insufficient_quota","mess"#),
            ErrorBody::default()
        );
        assert_eq!(
            ErrorBody::parse(b"<html><body>502 Bad Gateway"),
            ErrorBody::default()
        );
        assert_eq!(
            ErrorBody::parse(br#"{"error": {"type": "x"} garbage"#).kind,
            None
        );
        assert_eq!(
            ErrorBody::parse(br#"{"other":{"type":"insufficient_quota","#),
            ErrorBody::default()
        );
    }

    proptest! {
        /// Any JSON document, cut anywhere: the scan never panics and finds only what the whole
        /// document says.
        #[test]
        fn a_cut_never_invents_a_field(
            kind in "[a-z_]{0,12}",
            message in "\\PC{0,40}",
            code in prop_oneof![any::<i32>().prop_map(|n| serde_json::json!(n)), "[a-z_]{0,8}".prop_map(|s| serde_json::json!(s))],
            extra in prop::collection::vec(("[a-z]{1,6}", "[a-z0-9 ]{0,6}"), 0..4),
            cut in 0usize..400,
        ) {
            let mut error = serde_json::Map::new();
            for (k, v) in &extra {
                error.insert(k.clone(), serde_json::json!({ "nested": [v, 1, null] }));
            }
            error.insert("type".into(), serde_json::json!(kind));
            error.insert("message".into(), serde_json::json!(message));
            error.insert("code".into(), code);
            let text = serde_json::json!({ "error": error, "type": "error" }).to_string();
            let whole = ErrorBody::parse(text.as_bytes());
            let cut = cut.min(text.len());
            let part = ErrorBody::parse(&text.as_bytes()[..cut]);
            prop_assert!(part.kind.is_none() || part.kind == whole.kind);
            prop_assert!(part.code.is_none() || part.code == whole.code);
            prop_assert!(part.message.is_none() || part.message == whole.message);
        }
    }
}
