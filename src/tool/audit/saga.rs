//! The audit of the toolbox's sagas.

use super::{is_write, Finding, Severity};
use crate::tool::Toolbox;

/// What a saga needs of its steps: receipts and a key on each step and compensation (a resume
/// must not repeat one), and a compensation for every write that a later step's failure undoes.
pub(super) fn findings(tb: &Toolbox, out: &mut Vec<Finding>) {
    for (saga, spec) in tb.sagas() {
        // The decision lives in the first step's store: in memory, a crash forgets it, and a
        // resume may complete a saga whose undo had begun.
        let first = spec
            .steps
            .first()
            .and_then(|s| tb.tools().iter().find(|t| t.name == s.tool));
        if let Some((t, r)) = first.and_then(|t| Some((t, t.receipt.as_ref()?))) {
            if tb
                .stores()
                .get(&r.store)
                .is_some_and(|s| s.kind == "memory")
            {
                out.push(Finding {
                    severity: Severity::Error,
                    tool: t.name.clone(),
                    code: "saga-decision-in-memory",
                    message: format!("saga `{saga}` records its decisions in `{}`, a memory store: a crash forgets that it was undoing, and a resume may complete it instead.", r.store),
                    fix: "record the first step's receipts in a durable store (sqlite or postgres)",
                });
            }
        }
        let last = spec.steps.len().saturating_sub(1);
        for (i, step) in spec.steps.iter().enumerate() {
            for name in std::iter::once(&step.tool).chain(step.compensation.as_ref()) {
                let Some(t) = tb.tools().iter().find(|t| &t.name == name) else {
                    continue;
                };
                if t.receipt.is_none() || t.key.is_none() {
                    out.push(Finding {
                        severity: Severity::Error,
                        tool: name.clone(),
                        code: "saga-step-without-receipt",
                        message: format!("a step of saga `{saga}` without receipts and a key: a resume after a crash repeats it."),
                        fix: "declare `key` and `receipt` for every step and compensation of a saga",
                    });
                }
                if *name == step.tool
                    && i < last
                    && step.compensation.is_none()
                    && is_write(t.class)
                {
                    out.push(Finding {
                        severity: Severity::Error,
                        tool: name.clone(),
                        code: "saga-step-without-compensation",
                        message: format!("a write in saga `{saga}` that a later step's failure cannot undo: it has no compensation."),
                        fix: "declare the tool that undoes it (release, refund, void) as the step's `compensation`",
                    });
                }
            }
        }
    }
}
