//! A breaker's states and the transitions between them, as the `on_transition` callback and
//! the metrics see them.

/// A breaker's state.
///
/// ```
/// use stormguard::breaker::{Breaker, BreakerConfig, State};
///
/// assert_eq!(State::HalfOpen.as_str(), "half_open");
/// let breaker = Breaker::new("search", BreakerConfig::default());
/// assert_eq!(breaker.state(), State::Closed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls flow; outcomes are counted.
    Closed,
    /// Calls are rejected at once until a probe may go (see
    /// [`probe_after`](super::BreakerConfigBuilder::probe_after)).
    Open,
    /// A bounded number of trial calls decide whether to close or open again.
    HalfOpen,
}

impl State {
    /// The stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }

    pub(super) fn gauge(self) -> f64 {
        match self {
            State::Closed => 0.0,
            State::Open => 1.0,
            State::HalfOpen => 2.0,
        }
    }
}

/// One state transition, as passed to the `on_transition` callback.
///
/// ```
/// use stormguard::breaker::{State, Transition};
///
/// let t = Transition {
///     breaker: "billing-api".into(),
///     from: State::HalfOpen,
///     to: State::Open,
///     reason: "a trial call to billing-api failed; open for at least 250 ms".into(),
/// };
/// let line = format!("{}: {} -> {}", t.breaker, t.from.as_str(), t.to.as_str());
/// assert_eq!(line, "billing-api: half_open -> open");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The breaker's name.
    pub breaker: String,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// Why, in words (e.g. "8 of the last 10 counted calls failed").
    pub reason: String,
}
