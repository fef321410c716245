//! The audit of budgets: a named budget drawn on by tools of different dependencies lets one
//! dependency's outage spend the retries of the others (what a tool naming no budget never
//! does: it draws on its dependency's own).

use super::{Finding, Severity};
use crate::tool::Toolbox;
use std::collections::{BTreeMap, BTreeSet};

/// One finding per named budget whose tools declare two or more dependencies, where a tool
/// that declares none, beside one that does, is a dependency of its own (its name). A budget
/// whose tools declare no dependency at all is one the user chose to share: no finding.
pub(super) fn findings(tb: &Toolbox, out: &mut Vec<Finding>) {
    let mut dependencies: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut declared: BTreeSet<&str> = BTreeSet::new();
    for t in tb.tools() {
        if let Some(budget) = &t.budget {
            let owner = match &t.dependency {
                Some(d) => {
                    declared.insert(budget);
                    d.clone()
                }
                None => format!("{} (its own)", t.name),
            };
            dependencies.entry(budget).or_default().insert(owner);
        }
    }
    dependencies.retain(|budget, _| declared.contains(budget));
    for (budget, deps) in dependencies.into_iter().filter(|(_, d)| d.len() > 1) {
        let named: Vec<String> = deps.iter().map(|d| format!("`{d}`")).collect();
        out.push(Finding {
            severity: Severity::Warning,
            tool: format!("budgets.{budget}"),
            code: "budget-across-dependencies",
            message: format!(
                "budget `{budget}` is drawn on by the tools of {} dependencies ({}): an outage of one spends the retries of the others, and the refusal blames `{budget}`.",
                deps.len(),
                named.join(", ")
            ),
            fix: "leave `budget` out (the tools of each dependency share that dependency's own), or declare a budget per dependency",
        });
    }
}

/// One finding per group of `dependency` values that differ only in case and separators
/// (`orders-api`, `orders_api`, `Orders-API`): each is a budget of its own, so one outage is
/// counted in three budgets and none of them holds it back.
pub(super) fn spelling_findings(tb: &Toolbox, out: &mut Vec<Finding>) {
    let mut spellings: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for t in tb.tools() {
        if let Some(d) = &t.dependency {
            let folded: String = d
                .chars()
                .filter(|c| c.is_alphanumeric())
                .flat_map(char::to_lowercase)
                .collect();
            spellings.entry(folded).or_default().insert(d);
        }
    }
    for names in spellings.into_values().filter(|n| n.len() > 1) {
        let named: Vec<String> = names.iter().map(|d| format!("`{d}`")).collect();
        out.push(Finding {
            severity: Severity::Warning,
            tool: format!("dependency {}", named.join(", ")),
            code: "dependency-spelt-apart",
            message: format!(
                "{} look like one dependency spelt {} ways: each has a budget of its own, so one outage spends each and none holds the retries back.",
                named.join(", "),
                names.len()
            ),
            fix: "spell the dependency one way in every tool",
        });
    }
}
