//! A run's handle lent to the futures of the run ([`RetryBudget::scope`]): while they are
//! polled, a handle of the same budget that has no run of its own acts as the run's.
//!
//! The run sits in a thread-local slot while the scoped future is polled, as the operation's
//! ledger does (see [`operation`](crate::operation)); a flag without a destructor is read first,
//! so a budget outside any scope pays one thread-local read.

use super::ratio::Ratio;
use super::run::Run;
use super::RetryBudget;
use pin_project_lite::pin_project;
use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

thread_local! {
    /// Whether `CURRENT` holds a handle: read first, it has no destructor to register.
    static SCOPED: Cell<bool> = const { Cell::new(false) };
    /// The handle of the run whose future is being polled on this thread.
    static CURRENT: Cell<Option<RetryBudget>> = const { Cell::new(None) };
}

pin_project! {
    /// A future that runs as one agent run: see [`RetryBudget::scope`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::{RetryBudget, RunLimits, RunScoped};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let shared = RetryBudget::builder().floor(0, Duration::from_secs(60)).build().unwrap();
    /// let run = shared.for_run(RunLimits::default());
    /// let scoped: RunScoped<_> = run.scope({
    ///     let shared = shared.clone();
    ///     async move { shared.deposit() } // credits the run: it is in its scope
    /// });
    /// scoped.await;
    /// assert_eq!(run.run_credit(), Some(0.2));
    /// # }
    /// ```
    pub struct RunScoped<F> {
        #[pin]
        future: F,
        run: Option<RetryBudget>,
    }
}

impl<F> RunScoped<F> {
    pub(super) fn new(future: F, run: RetryBudget) -> Self {
        RunScoped {
            future,
            run: Some(run),
        }
    }
}

impl<F: Future> Future for RunScoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        in_run(this.run, || future.poll(cx))
    }
}

impl<F> fmt::Debug for RunScoped<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunScoped").field("run", &self.run).finish()
    }
}

/// Runs `f` with `slot`'s handle installed as this thread's run (if it holds one), and puts
/// back what was installed before, even if `f` panics.
pub(crate) fn in_run<R>(slot: &mut Option<RetryBudget>, f: impl FnOnce() -> R) -> R {
    if slot.is_none() {
        return f();
    }
    let _installed = Installed::new(slot);
    f()
}

/// The handle lent to the thread; gives it back on drop.
struct Installed<'a> {
    slot: &'a mut Option<RetryBudget>,
    before: Option<RetryBudget>,
    scoped_before: bool,
}

impl<'a> Installed<'a> {
    fn new(slot: &'a mut Option<RetryBudget>) -> Self {
        let scoped_before = SCOPED.get();
        SCOPED.set(true);
        let before = CURRENT.replace(slot.take());
        Installed {
            slot,
            before,
            scoped_before,
        }
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        *self.slot = CURRENT.replace(self.before.take());
        SCOPED.set(self.scoped_before);
    }
}

/// The run handle installed on this thread, if there is one (for carrying it to another task).
pub(crate) fn current() -> Option<RetryBudget> {
    if !SCOPED.get() {
        return None;
    }
    let current = CURRENT.take();
    let copy = current.clone();
    CURRENT.set(current);
    copy
}

/// Runs `f` on the run installed on this thread if it draws on `ratio`, else on none.
#[inline]
pub(super) fn with_current<T>(ratio: &Arc<Ratio>, f: impl FnOnce(Option<&Run>) -> T) -> T {
    if !SCOPED.get() {
        return f(None);
    }
    with_installed(ratio, f)
}

#[inline(never)]
fn with_installed<T>(ratio: &Arc<Ratio>, f: impl FnOnce(Option<&Run>) -> T) -> T {
    // Taken out while `f` runs (no borrow to hold, nothing to clone), then put back.
    let current = PutBack(CURRENT.take());
    let run = current
        .0
        .as_ref()
        .and_then(|budget| budget.run.as_deref())
        .filter(|run| run.draws_on(ratio));
    f(run)
}

/// The run installed on this thread if it draws on `ratio` (a clone of its handle).
pub(super) fn current_run(ratio: &Arc<Ratio>) -> Option<Arc<Run>> {
    with_current(ratio, |run| run.is_some())
        .then(current)
        .flatten()
        .and_then(|budget| budget.run)
}

/// Puts a handle taken from the slot back, even if what ran meanwhile panicked.
struct PutBack(Option<RetryBudget>);

impl Drop for PutBack {
    fn drop(&mut self) {
        CURRENT.set(self.0.take());
    }
}
