//! `decide` over the whole input space, and the budget's atomics against a small reference model
//! of runs (a `Vec` of credits) driven by random sequences of deposits, withdrawals, runs that end
//! and floor windows that turn.

use super::*;
use crate::budget::{RetryBudget, RunLimits};
use proptest::prelude::*;
use std::time::Duration;

const RETRY: i64 = crate::budget::ratio::RETRY;
const THROTTLED: i64 = crate::budget::ratio::THROTTLED;

fn ask() -> impl Strategy<Value = Ask> {
    (
        -30_000i64..120_000,
        0i64..60_000,
        0i64..120_000,
        prop_oneof![Just(RETRY), Just(THROTTLED)],
        0i64..20_000,
        0i64..50_000,
    )
        .prop_map(|(credit, lent, balance, cost, share, limit)| Ask {
            credit,
            lent,
            balance,
            cost,
            share,
            limit,
        })
}

proptest! {
    /// Each outcome comes exactly from the rule the module docs state.
    #[test]
    fn decide_follows_the_rules(a in ask()) {
        let after = a.credit - a.cost;
        match decide(a) {
            Draw::Own => prop_assert!(a.balance >= a.cost && a.credit >= a.cost),
            Draw::Borrow { loan } => {
                prop_assert!(a.balance >= a.cost);
                prop_assert!(loan > 0 && loan <= a.cost);
                prop_assert_eq!(loan, debt(after) - debt(a.credit));
                prop_assert!(debt(after) <= a.share, "a run owes at most its share");
                prop_assert!(a.lent + loan <= a.limit, "all runs owe at most the limit");
            }
            Draw::Floor(Short::Balance) => prop_assert!(a.balance < a.cost),
            Draw::Floor(Short::Share) => {
                prop_assert!(a.balance >= a.cost && a.credit < a.cost);
                prop_assert!(debt(after) > a.share);
            }
            Draw::Floor(Short::Limit) => {
                prop_assert!(a.balance >= a.cost && a.credit < a.cost);
                prop_assert!(debt(after) <= a.share);
                prop_assert!(a.lent + debt(after) - debt(a.credit) > a.limit);
            }
        }
        // A run with the money deposited always gets it while the balance has it.
        if a.credit >= a.cost && a.balance >= a.cost {
            prop_assert_eq!(decide(a), Draw::Own);
        }
    }
}

/// One step of a run's life, or of the clock.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// Run `i` succeeds (`None`: a plain handle, no run).
    Deposit(Option<usize>),
    /// Run `i` asks for a retry, throttled or not.
    Withdraw(Option<usize>, bool),
    /// Run `i`'s last handle is dropped; a new run takes its place.
    End(usize),
    /// The floor window turns.
    Turn,
}

const RUNS: usize = 4;

fn event() -> impl Strategy<Value = Event> {
    let run = prop_oneof![4 => (0..RUNS).prop_map(Some), 1 => Just(None)];
    prop_oneof![
        6 => run.clone().prop_map(Event::Deposit),
        6 => (run, any::<bool>()).prop_map(|(r, t)| Event::Withdraw(r, t)),
        1 => (0..RUNS).prop_map(Event::End),
        1 => Just(Event::Turn),
    ]
}

/// The budget as the docs describe it, on plain numbers (milli-retries).
#[derive(Debug)]
struct Model {
    balance: i64,
    max: i64,
    deposit: i64,
    share: i64,
    limit: i64,
    floor: u32,
    floor_used: u32,
    /// Each run's credit.
    credits: Vec<i64>,
    /// What ended runs left owing in this window.
    written_off: i64,
    /// Everything the balance took in, and everything drawn from it.
    deposited: i64,
    drawn: i64,
}

impl Model {
    fn lent(&self) -> i64 {
        self.credits.iter().map(|&c| debt(c)).sum::<i64>() + self.written_off
    }

    fn deposit(&mut self, run: Option<usize>) {
        let before = self.balance;
        if before < self.max {
            self.balance = (before + self.deposit).min(self.max);
        }
        self.deposited += self.balance - before;
        if let Some(i) = run {
            let c = self.credits[i];
            if c < self.max {
                self.credits[i] = (c + self.deposit).min(self.max);
            }
        }
    }

    /// Whether the retry is granted.
    fn withdraw(&mut self, run: Option<usize>, cost: i64) -> bool {
        let from_balance = match run {
            None => self.balance >= cost,
            Some(i) => {
                let (before, after) = (debt(self.credits[i]), debt(self.credits[i] - cost));
                let loan = after - before;
                let ok = self.balance >= cost
                    && (loan == 0 || (after <= self.share && self.lent() + loan <= self.limit));
                if ok {
                    self.credits[i] -= cost;
                }
                ok
            }
        };
        if from_balance {
            self.balance -= cost;
            self.drawn += cost;
            return true;
        }
        if self.floor_used < self.floor {
            self.floor_used += 1;
            return true;
        }
        false
    }

    fn end(&mut self, i: usize) {
        self.written_off += debt(self.credits[i]);
        self.credits[i] = 0;
    }

    fn turn(&mut self) {
        self.written_off = 0;
        self.floor_used = 0;
    }
}

fn milli(x: f64) -> i64 {
    (x * RETRY as f64).round() as i64
}

/// The settings a case runs with: (max_balance, run_share, lending_limit, floor).
fn terms() -> impl Strategy<Value = (u32, u32, u32, u32)> {
    (1u32..30, 0u32..8, 0u32..12, 0u32..3)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The atomics do what the model does, step by step, and the invariants hold throughout:
    /// the runs' debts stay within the limit, the balance never goes below zero, a run with the
    /// money deposited gets it, and nothing is created.
    #[test]
    fn the_budget_follows_the_model(
        (max_balance, share, limit, floor) in terms(),
        events in proptest::collection::vec(event(), 1..120),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let window = Duration::from_secs(60);
            let shared = RetryBudget::builder()
                .max_balance(max_balance)
                .run_share(share)
                .lending_limit(limit)
                .floor(floor, window)
                .build()
                .unwrap();
            let mut runs: Vec<RetryBudget> =
                (0..RUNS).map(|_| shared.for_run(RunLimits::default())).collect();
            let mut model = Model {
                balance: 0,
                max: i64::from(max_balance) * RETRY,
                deposit: 200,
                share: i64::from(share) * RETRY,
                limit: i64::from(limit) * RETRY,
                floor,
                floor_used: 0,
                credits: vec![0; RUNS],
                written_off: 0,
                deposited: 0,
                drawn: 0,
            };
            let handle = |runs: &[RetryBudget], r: Option<usize>| match r {
                Some(i) => runs[i].clone(),
                None => shared.clone(),
            };
            for (step, event) in events.into_iter().enumerate() {
                match event {
                    Event::Deposit(r) => {
                        handle(&runs, r).deposit();
                        model.deposit(r);
                    }
                    Event::Withdraw(r, throttled) => {
                        let cost = if throttled { THROTTLED } else { RETRY };
                        let own = r.is_some_and(|i| model.credits[i] >= cost)
                            && model.balance >= cost;
                        let balance = model.balance;
                        let budget = handle(&runs, r);
                        let got = if throttled {
                            budget.try_withdraw_throttled(Duration::ZERO)
                        } else {
                            budget.try_withdraw(Duration::ZERO)
                        };
                        let expected = model.withdraw(r, cost);
                        prop_assert_eq!(got.is_ok(), expected, "step {}: {:?}", step, event);
                        if own {
                            // Its own money, from the balance: not the floor's.
                            prop_assert_eq!(model.balance, balance - cost);
                        }
                    }
                    Event::End(i) => {
                        runs[i] = shared.for_run(RunLimits::default()); // the old one dropped
                        model.end(i);
                    }
                    Event::Turn => {
                        tokio::time::advance(window).await;
                        model.turn();
                    }
                }
                prop_assert_eq!(milli(shared.balance()), model.balance, "step {}", step);
                prop_assert_eq!(milli(shared.lent()), model.lent(), "step {}", step);
                for (i, run) in runs.iter().enumerate() {
                    prop_assert_eq!(run.run_credit().map(milli), Some(model.credits[i]));
                }
                prop_assert!(model.lent() <= model.limit, "all loans within the limit");
                prop_assert!(model.balance >= 0);
                prop_assert_eq!(model.balance, model.deposited - model.drawn, "nothing created");
                prop_assert!(model.credits.iter().all(|&c| debt(c) <= model.share));
            }
            Ok(())
        })?;
    }
}
