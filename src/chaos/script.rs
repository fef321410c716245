//! The parts of an episode a user declares: the agent's [`Step`]s, what the provider really does
//! with a call ([`Applies`]), and when a crashed run resumes ([`Resume`]).

use crate::class::ToolClass;
use crate::tool::Call;
use serde_json::Value;

/// One call of the agent's script: a tool of the toolbox and the model's arguments, and how
/// the model words the same request when it asks again.
///
/// ```
/// use serde_json::json;
/// let step = stormguard::chaos::Step::new("send_invoice", json!({ "invoice_id": 4471, "note": "due" }))
///     .reworded(json!({ "invoice_id": 4471, "note": "payment due" }));
/// assert_eq!(step.tool, "send_invoice");
/// assert_eq!(step.reworded.unwrap()["note"], "payment due");
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Step {
    /// The tool called.
    pub tool: String,
    /// The model's arguments.
    pub args: Value,
    /// The arguments of the model's reworded reissue (the same request in other words); `None`:
    /// it reissues the same arguments.
    pub reworded: Option<Value>,
    /// What the caller knows beyond the arguments, by name (see
    /// [`Call::with`](crate::tool::Call::with)): a quota counted per tenant reads `tenant`.
    pub context: Vec<(String, String)>,
}

impl Step {
    /// A call of `tool` with `args`.
    pub fn new(tool: &str, args: Value) -> Self {
        Step {
            tool: tool.to_owned(),
            args,
            reworded: None,
            context: Vec::new(),
        }
    }

    /// Every call of this step carries `name` = `value` beside its arguments, as the caller's
    /// [`Call::with`](crate::tool::Call::with) would (a tool whose quota is keyed on `tenant`
    /// needs it, or no call reaches the provider).
    ///
    /// ```
    /// let step = stormguard::chaos::Step::new("search", serde_json::json!({ "q": "x" })).with("tenant", "acme");
    /// assert_eq!(step.context, [("tenant".to_owned(), "acme".to_owned())]);
    /// ```
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.context.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The call of this step the agent makes at `turn` of `run`, with `args`.
    pub(super) fn call(&self, run: &str, turn: u32, args: &Value) -> Call {
        let call = Call::new(run, format!("step-{turn}"), args.clone());
        self.context
            .iter()
            .fold(call, |call, (name, value)| call.with(name, value))
    }

    /// The arguments the model sends when it asks for the same thing again in other words
    /// (see [`Harness::rewords`](super::Harness::rewords)).
    pub fn reworded(mut self, args: Value) -> Self {
        self.reworded = Some(args);
        self
    }
}

/// What the provider behind a tool really does with a call that reaches it: the harness counts
/// effects by it. By default it follows the tool's declared class (a read does nothing, an
/// idempotent write once per arguments, a keyed write once per idempotency key, an unkeyed or
/// multi-step write every time); [`Harness::applies`](super::Harness::applies) says otherwise for a tool whose
/// declaration is the thing under test.
///
/// ```
/// use stormguard::chaos::Applies;
/// use stormguard::class::ToolClass;
/// assert_eq!(Applies::of(ToolClass::KeyedWrite), Applies::OncePerKey);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applies {
    /// No effect (a read).
    #[default]
    Nothing,
    /// Once per arguments (a natural idempotent write: set a status).
    OncePerArgs,
    /// Once per idempotency key within the provider's key window (the tool's
    /// `provider_key_window_secs`, 24 h if it declares none); a call without a key, every time.
    OncePerKey,
    /// Every call (a provider without key support).
    EveryCall,
}

impl Applies {
    /// What a provider of `class` does.
    pub fn of(class: ToolClass) -> Self {
        match class {
            ToolClass::Read => Applies::Nothing,
            ToolClass::IdempotentWrite => Applies::OncePerArgs,
            ToolClass::KeyedWrite => Applies::OncePerKey,
            ToolClass::UnkeyedWrite | ToolClass::MultiStep => Applies::EveryCall,
        }
    }
}

/// When the process that resumes a crashed run starts, each crash drawing one of those
/// [`Harness::resumes`](super::Harness::resumes) lists.
///
/// ```
/// assert_ne!(stormguard::chaos::Resume::AtOnce, stormguard::chaos::Resume::AfterLease);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resume {
    /// A second after the crash: the crashed call's lease is still held.
    AtOnce,
    /// Once the longest receipt lease of the toolbox has passed.
    AfterLease,
    /// Once the provider's longest key window has passed too (a run resumed the next day).
    AfterKeyWindow,
}
