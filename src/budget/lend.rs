//! The lending decision: where one run's retry is paid from. A pure function of plain numbers
//! (milli-retries); `Run::draw` carries it out on atomics.
//!
//! A run's *credit* is what it deposited into the shared balance minus what it drew from it; a
//! run whose credit is below zero owes that much (its *debt*). A retry the run's credit covers
//! is paid from the run's own money. One that it does not is a *loan*, allowed only while
//!
//! - the run's debt stays within its `share` (what one run may owe), and
//! - the debts of all runs together (`lent`, which also counts what runs that ended in debt left
//!   owing in the current floor window) stay within the `limit` (what all runs may owe).
//!
//! A retry that is neither goes to the floor, as does one the balance cannot pay.

/// What a run asks with, in milli-retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ask {
    /// The run's standing: deposited minus drawn (below zero: it owes that much).
    pub(super) credit: i64,
    /// What all runs owe together now.
    pub(super) lent: i64,
    /// What the shared balance holds.
    pub(super) balance: i64,
    /// What the retry costs.
    pub(super) cost: i64,
    /// The most one run may owe.
    pub(super) share: i64,
    /// The most all runs together may owe.
    pub(super) limit: i64,
}

/// Where a retry is paid from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Draw {
    /// From what the run deposited.
    Own,
    /// Wholly or partly on loan: the run's debt grows by `loan` (the rest of the cost, if any,
    /// is its own money).
    Borrow { loan: i64 },
    /// Not from the balance: one use of the floor if it has one left, else a refusal.
    Floor(Short),
}

/// Why a retry is not paid from the balance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Short {
    /// The balance holds less than the retry costs.
    Balance,
    /// The run already owes its share.
    Share,
    /// All runs together owe the lending limit.
    Limit,
}

impl Short {
    /// The label of the refusal metric.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Short::Balance => "balance",
            Short::Share => "run_share",
            Short::Limit => "lending_limit",
        }
    }
}

/// What a run with `credit` owes.
#[inline]
pub(super) fn debt(credit: i64) -> i64 {
    credit.saturating_neg().max(0)
}

/// Where the retry `ask` describes is paid from.
pub(super) fn decide(ask: Ask) -> Draw {
    if ask.balance < ask.cost {
        return Draw::Floor(Short::Balance);
    }
    let after = ask.credit.saturating_sub(ask.cost);
    let loan = debt(after) - debt(ask.credit);
    if loan == 0 {
        return Draw::Own;
    }
    if debt(after) > ask.share {
        return Draw::Floor(Short::Share);
    }
    if ask.lent.saturating_add(loan) > ask.limit {
        return Draw::Floor(Short::Limit);
    }
    Draw::Borrow { loan }
}

#[cfg(test)]
mod tests;
