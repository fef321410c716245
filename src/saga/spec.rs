//! [`SagaSpec`]: a saga's steps, each a declared tool, with their compensations.

use serde::{Deserialize, Serialize};

/// One step of a saga: the tool that does it, and the tool that undoes it (`None`: the step
/// needs no undoing, or it is the last one).
///
/// ```
/// use stormguard::saga::SagaStep;
/// let s = SagaStep { tool: "charge".into(), compensation: Some("refund".into()) };
/// assert_eq!(serde_json::to_value(&s).unwrap()["compensation"], "refund");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaStep {
    /// The tool that does the step.
    pub tool: String,
    /// The tool that undoes it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<String>,
}

/// A saga's steps, in order, each a tool of the toolbox: declared with
/// [`Toolbox::with_saga`](crate::tool::Toolbox::with_saga) (or under `sagas` in the tool file),
/// built with [`Tools::saga`](crate::tool::Tools::saga).
///
/// ```
/// use stormguard::saga::SagaSpec;
/// let spec = SagaSpec::new().step("reserve", Some("release")).step("issue", None);
/// assert_eq!(spec.steps.len(), 2);
/// let back: SagaSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
/// assert_eq!(back, spec);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaSpec {
    /// The steps, in the order they run.
    pub steps: Vec<SagaStep>,
}

impl SagaSpec {
    /// No steps yet.
    ///
    /// ```
    /// assert!(stormguard::saga::SagaSpec::new().steps.is_empty());
    /// ```
    pub fn new() -> Self {
        SagaSpec::default()
    }

    /// Adds a step done by `tool`, undone by `compensation`.
    ///
    /// ```
    /// let spec = stormguard::saga::SagaSpec::new().step("charge", Some("refund"));
    /// assert_eq!(spec.steps[0].compensation.as_deref(), Some("refund"));
    /// ```
    pub fn step(mut self, tool: &str, compensation: Option<&str>) -> Self {
        self.steps.push(SagaStep {
            tool: tool.to_owned(),
            compensation: compensation.map(str::to_owned),
        });
        self
    }
}
