//! [`Evidence`]: what a request or a tool's name shows about what it does, checked against the
//! class a layer was given. The stricter of the two decides, and the crate says so.

use super::ToolClass;

/// What the crate can see of a call, beside the class it was declared: an HTTP method that is
/// not idempotent, or a tool name that begins with a verb that creates or sends.
///
/// A [`Retry`](crate::retry::Retry) layer asks its request for evidence
/// ([`Request::evidence`](crate::retry::Request::evidence)) before the first attempt and decides
/// the operation as the stricter of the evidence's class and its own; a
/// [`Toolbox`](crate::tool::Toolbox) does the same with each tool's name. When that changes a
/// decision it logs a WARN once per layer, counts `stormguard_class_from_evidence_total`
/// (labels `declared`, `seen`, `evidence`), and an error it ends with says why in its hint. A
/// user who knows better (an endpoint that is a POST and is still safe to resend, such as a
/// search API's) says so with [`RetryLayer::trust_class`](crate::retry::RetryLayer::trust_class)
/// (`trust_class = true` in a tool table).
///
/// ```
/// use stormguard::class::{Evidence, ToolClass};
///
/// // RFC 9110 §9.2.2: POST and PATCH are not idempotent; a key makes a retry safe.
/// let post = Evidence::http("POST", "/tickets", false).unwrap();
/// assert_eq!((post.as_str(), post.class()), ("unkeyed_method", ToolClass::UnkeyedWrite));
/// assert_eq!(Evidence::http("POST", "/charges", true).map(Evidence::class), Some(ToolClass::KeyedWrite));
/// // GET, PUT and DELETE are idempotent; a model API's completion is a POST that changes nothing.
/// assert_eq!(Evidence::http("GET", "/orders/7", false), None);
/// assert_eq!(Evidence::http("POST", "/v1/chat/completions", false), None);
///
/// assert_eq!(Evidence::tool_name("create_ticket").and_then(Evidence::verb), Some("create"));
/// assert_eq!(Evidence::tool_name("sendInvoice").and_then(Evidence::verb), Some("send"));
/// assert_eq!(Evidence::tool_name("search_orders"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Evidence(Seen);

/// What was seen (two bytes, so that an operation's state carries it for free).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Seen {
    /// An HTTP POST or PATCH without an `Idempotency-Key` header: not idempotent (RFC 9110
    /// §9.2.2), so an ambiguous failure may have taken effect.
    UnkeyedMethod,
    /// An HTTP POST or PATCH with an `Idempotency-Key`: a write made safe by its key.
    KeyedMethod,
    /// A tool name that begins with the verb `WRITE_VERBS[i]`.
    WriteVerb(u8),
    /// The tool answered `201 Created` (RFC 9110 §15.3.2): its calls create something.
    CreatedAnswer,
    /// The tool's server annotates it `destructiveHint: true` (and not idempotent): doing it
    /// twice may do it twice.
    Destructive,
}

/// The verbs whose tools create, send or pay for something: doing one twice does it twice.
const WRITE_VERBS: &[&str] = &[
    "append", "book", "buy", "charge", "create", "email", "enqueue", "insert", "invite", "issue",
    "pay", "place", "post", "publish", "purchase", "refund", "register", "reply", "reserve",
    "send", "submit", "transfer", "tweet", "withdraw", "write",
];

/// Paths of model APIs whose POST produces an answer and changes nothing (a completion, a
/// message, an embedding): not evidence of a write.
const ANSWER_PATHS: &[&str] = &[
    "/chat/completions",
    "/completions",
    "/embeddings",
    "/responses",
    "/messages",
    "/messages/count_tokens",
    ":generateContent",
    ":streamGenerateContent",
    ":embedContent",
    "/moderations",
];

/// Whether `path` is a model API's answer path (`/chat/completions`, `/messages`, ...).
pub(crate) fn answer_path(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    ANSWER_PATHS.iter().any(|p| path.ends_with(p))
}

impl Evidence {
    /// The evidence of an HTTP request: its method, its path and whether it carries an
    /// `Idempotency-Key`. `None` for a method that is idempotent by RFC 9110 (GET, HEAD,
    /// OPTIONS, PUT, DELETE, TRACE) and for a POST to a model API's answer path
    /// (`/chat/completions`, `/messages`, `/embeddings`, `:generateContent`, ...).
    pub fn http(method: &str, path: &str, keyed: bool) -> Option<Evidence> {
        if !(method.eq_ignore_ascii_case("POST") || method.eq_ignore_ascii_case("PATCH")) {
            return None;
        }
        if keyed {
            return Some(Evidence(Seen::KeyedMethod));
        }
        if answer_path(path) {
            return None;
        }
        Some(Evidence(Seen::UnkeyedMethod))
    }

    /// The evidence of a tool's name: its first word (split at `_`, `-`, `.`, `/`, a space or
    /// a lower-to-upper case change) when it is a verb that creates, sends or pays.
    pub fn tool_name(name: &str) -> Option<Evidence> {
        let first = first_word(name);
        let i = WRITE_VERBS
            .iter()
            .position(|verb| first.eq_ignore_ascii_case(verb))?;
        Some(Evidence(Seen::WriteVerb(u8::try_from(i).ok()?)))
    }

    /// The evidence of a tool's MCP annotations: `destructiveHint: true` without
    /// `idempotentHint: true` (the server says a call changes something and a repeat may change
    /// it again). Hints, not guarantees; but where they disagree with a declared read, the
    /// stricter wins.
    ///
    /// ```
    /// use stormguard::class::{Evidence, ToolClass};
    /// let e = Evidence::annotations(Some(true), None).unwrap(); // destructive
    /// assert_eq!(e.tighten(ToolClass::Read, false), ToolClass::UnkeyedWrite);
    /// assert!(Evidence::annotations(Some(true), Some(true)).is_none()); // and idempotent
    /// assert!(Evidence::annotations(None, None).is_none());
    /// ```
    pub fn annotations(destructive: Option<bool>, idempotent: Option<bool>) -> Option<Evidence> {
        (destructive == Some(true) && idempotent != Some(true))
            .then_some(Evidence(Seen::Destructive))
    }

    /// The evidence of a tool that answered `201 Created`: each call creates something.
    pub(crate) fn created_answer() -> Evidence {
        Evidence(Seen::CreatedAnswer)
    }

    /// The verb of a tool name's evidence (`"create"`), `None` for a request's.
    pub fn verb(self) -> Option<&'static str> {
        match self.0 {
            Seen::WriteVerb(i) => WRITE_VERBS.get(usize::from(i)).copied(),
            _ => None,
        }
    }

    /// The class the evidence implies.
    pub fn class(self) -> ToolClass {
        match self.0 {
            Seen::UnkeyedMethod | Seen::WriteVerb(_) | Seen::CreatedAnswer | Seen::Destructive => {
                ToolClass::UnkeyedWrite
            }
            Seen::KeyedMethod => ToolClass::KeyedWrite,
        }
    }

    /// The class a layer declared `declared` decides with, given this evidence and whether the
    /// request carries a key: the stricter of the two, where the evidence is stricter. A tool
    /// named for a write that declares a key is a `KeyedWrite`.
    ///
    /// A layer declared `KeyedWrite` (or `MultiStep`) already decides by whether a key was
    /// really carried (a key stamped by a layer below counts), so a request's evidence leaves
    /// it as it is: the evidence raises only `Read` and `IdempotentWrite`.
    ///
    /// ```
    /// use stormguard::class::{Evidence, ToolClass};
    /// let post = Evidence::http("POST", "/tickets", false).unwrap();
    /// assert_eq!(post.tighten(ToolClass::Read, false), ToolClass::UnkeyedWrite);
    /// assert_eq!(post.tighten(ToolClass::KeyedWrite, false), ToolClass::KeyedWrite);
    /// ```
    pub fn tighten(self, declared: ToolClass, keyed: bool) -> ToolClass {
        if declared >= ToolClass::KeyedWrite {
            return declared;
        }
        let seen = match self.0 {
            Seen::WriteVerb(_) | Seen::CreatedAnswer | Seen::Destructive if keyed => {
                ToolClass::KeyedWrite
            }
            _ => self.class(),
        };
        declared.strictest(seen)
    }

    /// The class an operation decided as `base` decides with once this evidence is weighed,
    /// where that changes what it does with a transient or an ambiguous failure; `None` where
    /// it changes nothing (the evidence is then not reported).
    ///
    /// ```
    /// use stormguard::class::{Evidence, ToolClass};
    /// let post = Evidence::http("POST", "/tickets", false).unwrap();
    /// assert_eq!(post.overrule(ToolClass::Read, false), Some(ToolClass::UnkeyedWrite));
    /// assert_eq!(post.overrule(ToolClass::UnkeyedWrite, false), None);
    /// // A key makes a POST as safe to resend as a read.
    /// let keyed = Evidence::http("POST", "/charges", true).unwrap();
    /// assert_eq!(keyed.overrule(ToolClass::Read, true), None);
    /// ```
    pub fn overrule(self, base: ToolClass, keyed: bool) -> Option<ToolClass> {
        use crate::classify::FailureClass;
        let seen = self.tighten(base, keyed);
        let alike = [FailureClass::Transient, FailureClass::Ambiguous]
            .iter()
            .all(|&f| base.decide(f, keyed) == seen.decide(f, keyed));
        (!alike).then_some(seen)
    }

    /// A short label for metrics and logs: `unkeyed_method`, `keyed_method`, `write_verb`,
    /// `created_answer`, `destructive_annotation`.
    pub fn as_str(self) -> &'static str {
        match self.0 {
            Seen::UnkeyedMethod => "unkeyed_method",
            Seen::KeyedMethod => "keyed_method",
            Seen::WriteVerb(_) => "write_verb",
            Seen::CreatedAnswer => "created_answer",
            Seen::Destructive => "destructive_annotation",
        }
    }

    /// What was seen, in words: "an HTTP POST or PATCH without an Idempotency-Key".
    pub fn describe(self) -> String {
        match self.0 {
            Seen::UnkeyedMethod => {
                "an HTTP POST or PATCH without an Idempotency-Key (not idempotent, RFC 9110 \
                 section 9.2.2)"
                    .to_owned()
            }
            Seen::KeyedMethod => "an HTTP POST or PATCH with an Idempotency-Key".to_owned(),
            Seen::WriteVerb(_) => {
                format!(
                    "a tool named for a write (\"{}\")",
                    self.verb().unwrap_or("?")
                )
            }
            Seen::CreatedAnswer => "a tool that answered 201 Created (it creates)".to_owned(),
            Seen::Destructive => {
                "a tool its server annotates destructiveHint: true (a repeat may change it again)"
                    .to_owned()
            }
        }
    }
}

/// The first word of a name: up to a separator or a lower-to-upper case change.
fn first_word(name: &str) -> &str {
    let name = name.trim_start_matches(|c: char| !c.is_alphanumeric());
    let mut prev_lower = false;
    for (i, c) in name.char_indices() {
        if !c.is_alphanumeric() || (prev_lower && c.is_uppercase()) {
            return &name[..i];
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_words() {
        for (name, first) in [
            ("create_ticket", "create"),
            ("sendInvoice", "send"),
            ("post-ticket", "post"),
            ("search", "search"),
            ("tickets.create", "tickets"),
            ("", ""),
            ("_send_it", "send"),
            ("HTTPGet", "HTTPGet"),
        ] {
            assert_eq!(first_word(name), first, "{name}");
        }
    }

    #[test]
    fn reads_are_not_writes() {
        for name in [
            "get_order",
            "search_orders",
            "list_posts",
            "postal_code_lookup",
            "opener",
        ] {
            assert_eq!(Evidence::tool_name(name), None, "{name}");
        }
    }

    #[test]
    fn methods() {
        let unkeyed = Some(Evidence(Seen::UnkeyedMethod));
        assert_eq!(Evidence::http("patch", "/t/1", false), unkeyed);
        assert_eq!(Evidence::http("PUT", "/t/1", false), None);
        assert_eq!(Evidence::http("DELETE", "/t/1", false), None);
        assert_eq!(Evidence::http("POST", "/v1/messages/", false), None);
        assert_eq!(
            Evidence::http("POST", "/v1beta/models/g:generateContent", false),
            None
        );
        assert_eq!(
            Evidence::http("POST", "/v1/messages/batches", false),
            unkeyed
        );
        assert!(std::mem::size_of::<Option<Evidence>>() <= 3);
    }

    #[test]
    fn tighten_never_loosens() {
        for declared in [
            ToolClass::Read,
            ToolClass::IdempotentWrite,
            ToolClass::KeyedWrite,
            ToolClass::UnkeyedWrite,
            ToolClass::MultiStep,
        ] {
            for e in [Seen::UnkeyedMethod, Seen::KeyedMethod, Seen::WriteVerb(0)].map(Evidence) {
                for keyed in [false, true] {
                    assert!(e.tighten(declared, keyed) >= declared);
                }
            }
        }
        assert_eq!(
            Evidence(Seen::WriteVerb(0)).tighten(ToolClass::Read, true),
            ToolClass::KeyedWrite
        );
    }
}
