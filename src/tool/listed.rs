//! What an MCP server lists (`tools/list`) as evidence against the tool table: the names and
//! annotations it answers, merged into the toolbox and audited with it. No rmcp needed: the
//! answer is JSON, read from a file by `stormguard-audit --mcp` or from a live session by
//! [`Toolbox::with_mcp_tools`](crate::tool::Toolbox) (feature `rmcp`).

use std::collections::BTreeSet;

use serde_json::Value;

use super::audit::{Audit, Finding, Severity};
use super::parts::{Annotations, RetryOwner, UnknownOutcome};
use super::spec::Tool;
use super::toolbox::{SpecError, Toolbox};
use crate::class::ToolClass;

/// One tool as an MCP server lists it: its name and the annotations it declares.
///
/// ```
/// use stormguard::tool::ListedTool;
/// let answer = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
///     {"name": "search", "inputSchema": {}, "annotations": {"readOnlyHint": true, "title": "Search"}},
///     {"name": "post_ticket", "inputSchema": {}},
/// ]}});
/// let listed = ListedTool::from_tools_list(&answer)?;
/// assert_eq!(listed[0].name, "search");
/// assert_eq!(listed[0].annotations.unwrap().read_only_hint, Some(true));
/// assert!(listed[1].annotations.is_none());
/// # Ok::<(), stormguard::tool::SpecError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedTool {
    /// The tool's name.
    pub name: String,
    /// Its hints, as the server declares them (`None`: it declares none).
    pub annotations: Option<Annotations>,
}

fn hint(annotations: &Value, field: &str, tool: &str) -> Result<Option<bool>, SpecError> {
    match annotations.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(SpecError::new(
            Some(tool),
            field,
            "an annotation hint is true or false",
        )),
    }
}

impl ListedTool {
    /// Reads a `tools/list` answer: the JSON-RPC response (`{"result": {"tools": [...]}}`), its
    /// result (`{"tools": [...]}`) or the bare array. Other annotations (`title`,
    /// `openWorldHint`) are ignored; a tool without a name, or a hint that is not a boolean, is a
    /// [`SpecError`], never skipped, and so is one page of several (a `nextCursor`): an audit of
    /// part of the list would pass the rest unseen.
    ///
    /// ```
    /// use stormguard::tool::ListedTool;
    /// let err = ListedTool::from_tools_list(&serde_json::json!({"tools": [{"title": "x"}]})).unwrap_err();
    /// assert_eq!(err.field(), "name");
    /// let err = ListedTool::from_tools_list(&serde_json::json!({"error": {"code": -32601}})).unwrap_err();
    /// assert_eq!(err.field(), "tools");
    /// ```
    pub fn from_tools_list(answer: &Value) -> Result<Vec<ListedTool>, SpecError> {
        let tools = match answer {
            Value::Array(a) => Some(a),
            _ => answer
                .get("result")
                .unwrap_or(answer)
                .get("tools")
                .and_then(Value::as_array),
        };
        let page = answer.get("result").unwrap_or(answer);
        if page.get("nextCursor").is_some_and(|c| !c.is_null()) {
            return Err(SpecError::new(
                None,
                "nextCursor",
                "the answer is one page of several (nextCursor): an audit of part of the list misses the rest; save every page's tools in one {\"tools\": [...]}",
            ));
        }
        let Some(tools) = tools else {
            return Err(SpecError::new(
                None,
                "tools",
                "not a tools/list answer: expected {\"tools\": [...]} (or the JSON-RPC response holding it)",
            ));
        };
        tools
            .iter()
            .map(|t| {
                let Some(name) = t.get("name").and_then(Value::as_str) else {
                    return Err(SpecError::new(
                        None,
                        "name",
                        "a listed tool has no name (a string)",
                    ));
                };
                let annotations = match t.get("annotations") {
                    None | Some(Value::Null) => None,
                    Some(a) => Some(Annotations {
                        read_only_hint: hint(a, "readOnlyHint", name)?,
                        idempotent_hint: hint(a, "idempotentHint", name)?,
                        destructive_hint: hint(a, "destructiveHint", name)?,
                    }),
                };
                Ok(ListedTool {
                    name: name.to_owned(),
                    annotations,
                })
            })
            .collect()
    }
}

impl Toolbox {
    /// The toolbox with the tools an MCP server lists: a tool it declares keeps its declaration
    /// and takes the server's annotations (the server's word of now is the evidence the audit
    /// checks the class against); any other is declared from its annotations, as documentation
    /// and never as the guarantee: read-only is a read and idempotent an idempotent write, both
    /// retried by the layer; anything else an unkeyed write nobody retries, whose unknown
    /// outcome is escalated. A name the toolbox cannot hold (an empty one) is a [`SpecError`];
    /// a name listed twice is declared once.
    ///
    /// ```
    /// use stormguard::class::ToolClass;
    /// use stormguard::tool::{ListedTool, Toolbox};
    /// let listed = ListedTool::from_tools_list(&serde_json::json!({"tools": [
    ///     {"name": "search", "annotations": {"readOnlyHint": true}},
    ///     {"name": "post_ticket"},
    /// ]}))?;
    /// let toolbox = Toolbox::new(vec![])?.with_listed_tools(&listed)?;
    /// assert_eq!(toolbox.tools()[0].class, ToolClass::Read);
    /// assert_eq!(toolbox.tools()[1].class, ToolClass::UnkeyedWrite);
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn with_listed_tools(mut self, listed: &[ListedTool]) -> Result<Self, SpecError> {
        for listed in listed {
            match self.tools_mut().iter_mut().find(|t| t.name == listed.name) {
                Some(declared) => {
                    if listed.annotations.is_some() {
                        declared.annotations = listed.annotations;
                    }
                }
                None => {
                    let class = listed
                        .annotations
                        .as_ref()
                        .map_or(ToolClass::UnkeyedWrite, Tool::class_from_annotations);
                    let owner = match class {
                        ToolClass::Read | ToolClass::IdempotentWrite => RetryOwner::Layer,
                        _ => RetryOwner::None,
                    };
                    let mut tool = Tool::new(&listed.name, class, owner);
                    if class != ToolClass::Read {
                        tool = tool.unknown_outcome(UnknownOutcome::Escalate);
                    }
                    if let Some(a) = listed.annotations {
                        tool = tool.annotations(a);
                    }
                    self = self.with_tool(tool)?;
                }
            }
        }
        self.validate().map(|()| self)
    }

    /// The audit of this table against what a server lists: [`Toolbox::with_listed_tools`]
    /// audited, plus `declared-not-listed` for each declared tool the server does not list (an
    /// error when the server lists an undeclared name one or two edits away: the misspelt tool
    /// runs on its annotations' class, not on yours; else a warning) and a `listed-not-declared` note for each tool declared only from
    /// its annotations. `stormguard-audit TOOLS.toml --mcp tools-list.json` prints it.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{ListedTool, RetryOwner, Tool, Toolbox}};
    /// let toolbox = Toolbox::new(vec![Tool::new("serch", ToolClass::Read, RetryOwner::Layer)])?;
    /// let listed = ListedTool::from_tools_list(&serde_json::json!({"tools": [
    ///     {"name": "search", "annotations": {"readOnlyHint": true}},
    /// ]}))?;
    /// let audit = toolbox.audit_against(&listed)?;
    /// let codes: Vec<_> = audit.findings.iter().map(|f| (f.tool.as_str(), f.code)).collect();
    /// assert!(codes.contains(&("serch", "declared-not-listed")));
    /// assert!(codes.contains(&("search", "listed-not-declared")));
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn audit_against(&self, listed: &[ListedTool]) -> Result<Audit, SpecError> {
        let declared: BTreeSet<&str> = self.tools().iter().map(|t| t.name.as_str()).collect();
        let names: BTreeSet<&str> = listed.iter().map(|t| t.name.as_str()).collect();
        let merged = self.clone().with_listed_tools(listed)?;
        let mut audit = merged.audit();
        for t in self.tools() {
            if names.contains(t.name.as_str()) {
                continue;
            }
            // A listed, undeclared name one or two edits away is the misspelt tool: it runs on
            // its annotations' class, not the declared one (an error); otherwise a warning.
            let near = names
                .iter()
                .find(|n| !declared.contains(**n) && edits(&t.name, n) <= 2);
            audit.findings.push(match near {
                Some(near) => Finding {
                    severity: Severity::Error,
                    tool: t.name.clone(),
                    code: "declared-not-listed",
                    message: format!("declared, but the server lists `{near}` and not this name: `{near}` runs undeclared, on the class its annotations suggest, and this declaration is never used."),
                    fix: "spell the name as the server lists it",
                },
                None => Finding {
                    severity: Severity::Warning,
                    tool: t.name.clone(),
                    code: "declared-not-listed",
                    message: "declared, but the server does not list it: if the name is misspelt, the server's tool runs undeclared, on the class its annotations suggest.".to_owned(),
                    fix: "spell the name as the server lists it (or drop the declaration)",
                },
            });
        }
        for name in names.difference(&declared) {
            audit.findings.push(Finding {
                severity: Severity::Note,
                tool: (*name).to_owned(),
                code: "listed-not-declared",
                message: "listed by the server but not declared: declared from its annotations, which are hints, not guarantees.".to_owned(),
                fix: "declare it in the table with the class you know it has",
            });
        }
        Ok(audit)
    }
}

/// The edit distance of two names (Levenshtein, by characters): small names, small cost.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut last = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (here + 1)
                .min(row[j] + 1)
                .min(last + usize::from(ca != *cb));
            last = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::edits;

    #[test]
    fn edits_count_insertions_deletions_and_substitutions() {
        assert_eq!(edits("send_invoice", "send_invoice"), 0);
        assert_eq!(edits("send_invoce", "send_invoice"), 1);
        assert_eq!(edits("book_shipment", "book_shipments"), 1);
        assert_eq!(edits("serch", "search"), 1);
        assert_eq!(edits("charge", "refund"), 6);
        assert_eq!(edits("", "ab"), 2);
    }
}
