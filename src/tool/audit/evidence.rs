//! The audit's rules that read what the runtime reads: a tool's name and its MCP annotations,
//! against its declared class (see [`Evidence`]).

use super::{Finding, Severity};
use crate::class::{Evidence, ToolClass};
use crate::tool::Tool;

/// A read (or an idempotent write) whose name or annotations say it is a write: the runtime
/// decides it as the stricter (the name) or the audit says so (a `destructiveHint`).
pub(super) fn findings(t: &Tool, out: &mut Vec<Finding>) {
    let mut add = super::adder(t, out);
    let lenient = matches!(t.class, ToolClass::Read | ToolClass::IdempotentWrite);
    if lenient && !t.trust_class {
        if let Some(verb) = Evidence::tool_name(&t.name).and_then(Evidence::verb) {
            add(
                Severity::Warning,
                "name-says-write-on-read",
                format!(
                    "the name begins with \"{verb}\" but the tool is declared {}: the runtime decides it as an unkeyed write (an ambiguous failure is not resent).",
                    t.class.as_str()
                ),
                "declare the write it is (keyed_write with a key, or unkeyed_write), or `trust_class = true` if it only reads",
            );
        }
    }
    if t.class == ToolClass::Read
        && t.annotations
            .is_some_and(|a| a.destructive_hint == Some(true))
    {
        add(
            Severity::Error,
            "annotation-destructive-on-read",
            "the server says destructiveHint: true but the tool is declared read: the runtime decides it as an unkeyed write (an ambiguous failure is not resent), and a model's reissue repeats it.".into(),
            "declare the write it is; a read has no destructive effect",
        );
    }
}
