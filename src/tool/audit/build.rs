//! The audit of what [`Toolbox::build`] and [`Tools::layer`](crate::tool::Tools::layer) would
//! refuse, or build without effect: a table the audit passes builds, so that "No findings."
//! never hides a refusal at start-up, nor a setting that does nothing.

use super::{Finding, Severity};
use crate::tool::{RetryOwner, Toolbox, UnknownOutcome};

/// The refusals of `build` and `layer` that the table alone shows.
pub(super) fn findings(tb: &Toolbox, out: &mut Vec<Finding>) {
    for (name, spec) in tb.stores() {
        if spec.kind == "redis" {
            out.push(Finding {
                severity: Severity::Error,
                tool: format!("stores.{name}"),
                code: "store-kind-not-built",
                message: format!("store `{name}` is of kind redis, and receipts have no Redis store: `build` refuses the table."),
                fix: "record receipts in sqlite, postgres or memory; Redis shares budgets, quotas and breakers (feature `redis`), not receipts",
            });
        }
    }
    for t in tb.tools() {
        if matches!(t.unknown_outcome, Some(UnknownOutcome::ReadBack { .. })) && t.receipt.is_none()
        {
            out.push(Finding {
                severity: Severity::Error,
                tool: t.name.clone(),
                code: "read-back-without-receipt",
                message: "a read-back runs in the receipt layer, and the tool records no receipts: `layer` refuses the tool.".into(),
                fix: "declare a key and a receipt, or `unknown_outcome = \"escalate\"` (an idempotent write resends safely: no read-back needed)",
            });
        }
        if t.receipt.is_some() && t.key.is_none() {
            out.push(Finding {
                severity: Severity::Error,
                tool: t.name.clone(),
                code: "receipt-without-key",
                message: "receipts are recorded under the call's key, and the tool declares none: `layer` refuses the tool.".into(),
                fix: "declare `key` from the run, the tool and identifier fields of the arguments",
            });
        }
        let layer_retries = t.retry.contains(&RetryOwner::Layer);
        if !layer_retries && (t.max_attempts.is_some() || t.backoff.is_some()) {
            out.push(Finding {
                severity: Severity::Warning,
                tool: t.name.clone(),
                code: "attempts-without-layer-retry",
                message: "`max_attempts` or `backoff` is declared, but the layer does not retry this tool (its retry owner is another): the stack makes one attempt and the setting does nothing.".into(),
                fix: "set `retry = [\"layer\"]` for the stack to retry with these settings, or leave them out (the owner retries with its own)",
            });
        }
    }
}
