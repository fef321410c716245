//! [`Tools::saga`]: a saga the toolbox declares, built over the tools' stacks.

use super::run::Saga;
use crate::tool::{Call, SpecError, ToolLayer, ToolRouter, ToolService, Tools};
use serde_json::Value;
use std::collections::BTreeMap;

impl Tools {
    /// The saga the toolbox declares as `name` ([`Toolbox::with_saga`](crate::tool::Toolbox::with_saga), or `sagas` in the file),
    /// each step through its tool's stack over `body` with `classifier`; its decisions are
    /// recorded in the first step's receipt store. Every step and compensation must be a tool
    /// with receipts and a key (a resume must not repeat it), or it is a [`SpecError`]. See
    /// [`crate::saga`].
    pub fn saga<S, C>(&self, name: &str, body: S, classifier: C) -> Result<Saga, SpecError>
    where
        ToolLayer<C>: tower_layer::Layer<S, Service = ToolService<Value>>,
        S: tower_service::Service<Call, Response = Value> + Clone,
        C: Clone,
    {
        let bad = |field: &str, reason: String| Err(SpecError::new(Some(name), field, &reason));
        let Some(spec) = self.toolbox().sagas().get(name) else {
            return bad("sagas", String::from("the toolbox declares no such saga"));
        };
        if spec.steps.is_empty() {
            return bad("steps", String::from("a saga needs at least one step"));
        }
        let mut names = Vec::new();
        for step in &spec.steps {
            names.push(step.tool.as_str());
            names.extend(step.compensation.as_deref());
        }
        let mut store = None;
        for tool in &names {
            let Some(t) = self.tool(tool) else {
                return bad("steps", format!("`{tool}` is not a tool of the toolbox"));
            };
            let Some(receipt) = t.receipt.as_ref().filter(|_| t.key.is_some()) else {
                return bad(
                    "steps",
                    format!("`{tool}` needs receipts and a key: a resume must not repeat it"),
                );
            };
            if store.is_none() {
                store = self.store(&receipt.store).cloned();
            }
        }
        let mut stacks = BTreeMap::new();
        for tool in names {
            let layer = self.layer(tool)?.classifier(classifier.clone());
            stacks.insert(
                tool.to_owned(),
                tower_layer::Layer::layer(&layer, body.clone()),
            );
        }
        let Some(store) = store else {
            return bad("steps", String::from("a saga needs at least one step"));
        };
        Ok(Saga::new(
            name,
            spec.steps.clone(),
            ToolRouter::new(stacks),
            store,
        ))
    }
}
