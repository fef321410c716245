//! [`Saga`]: runs the steps forward, decides to compensate, undoes in reverse, resumes.

use super::record::{decision_key, Decided};
use super::spec::SagaStep;
use crate::error::{ErrorCode, FailureClass, ToolError};
use crate::key::Action;
use crate::receipt::{AnyStore, Begin, ReceiptStore, StoreError};
use crate::telemetry;
use crate::tool::{Call, ToolRouter};
use serde_json::{json, Value};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_service::Service;

/// Why a saga run stopped before it completed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Halt {
    /// `step` failed for good; every step before it was undone (each compensation once).
    Compensated {
        /// The step that failed.
        step: String,
    },
    /// The outcome of `step` is unknown: settle its pending intent (the operator's
    /// `resolve`), then run the saga again.
    OutcomeUnknown {
        /// The step whose outcome is unknown.
        step: String,
    },
    /// `step` (a step, or a compensation once the saga decided to undo) failed in a way that may
    /// pass (a transient failure once its retries were spent: an outage, an open breaker, a rate
    /// limit; a duplicate in flight): run the saga again later; it goes on where it stopped.
    Paused {
        /// The step that could not be done now.
        step: String,
    },
    /// The compensation `step` failed for good: `left` is what is still to undo (that
    /// compensation first), for an operator.
    CompensationFailed {
        /// The compensation that failed.
        step: String,
        /// The compensations not done, in the order they must run.
        left: Vec<String>,
    },
    /// Another runner holds this run of the saga now.
    InProgress,
    /// The run cannot start: its id or name cannot be a key, or it was run before with other
    /// arguments.
    Refused {
        /// Why.
        reason: String,
    },
    /// The receipt store failed: nothing was decided; run it again.
    Store,
}

/// A saga run that stopped before it completed: [`halt`](Self::halt) says why and what is left.
#[derive(Debug)]
pub struct SagaError {
    halt: Halt,
    cause: Option<ToolError>,
    store: Option<StoreError>,
}

impl SagaError {
    fn new(halt: Halt) -> Self {
        SagaError {
            halt,
            cause: None,
            store: None,
        }
    }

    fn because(mut self, cause: ToolError) -> Self {
        self.cause = Some(cause);
        self
    }

    /// Why the run stopped.
    pub fn halt(&self) -> &Halt {
        &self.halt
    }

    /// The error of the step that stopped it, if a step did.
    pub fn cause(&self) -> Option<&ToolError> {
        self.cause.as_ref()
    }

    /// The store's error, for [`Halt::Store`].
    pub fn store_error(&self) -> Option<&StoreError> {
        self.store.as_ref()
    }

    /// The error as the model should see it: an unknown outcome and a failed compensation are
    /// `outcome_unknown` (an operator must act), a paused run or one in progress is retryable
    /// later, a compensated run is the failed step's own error, not retryable.
    pub fn to_tool_error(&self) -> ToolError {
        let (code, retryable, hint) = match &self.halt {
            Halt::Compensated { step } => (
                self.cause.as_ref().map_or(ErrorCode::Internal, ToolError::code),
                false,
                format!("step `{step}` failed; every step before it was undone"),
            ),
            Halt::OutcomeUnknown { step } => (
                ErrorCode::OutcomeUnknown,
                false,
                format!("the outcome of step `{step}` is unknown: an operator settles it, then the saga resumes"),
            ),
            Halt::CompensationFailed { step, left } => (
                ErrorCode::OutcomeUnknown,
                false,
                format!("undoing failed at `{step}`; still to undo: {}", left.join(", ")),
            ),
            Halt::Paused { step } => (
                self.cause.as_ref().map_or(ErrorCode::Unavailable, ToolError::code),
                true,
                format!("step `{step}` cannot be done now; run the saga again later"),
            ),
            Halt::InProgress => (
                ErrorCode::InProgress,
                true,
                String::from("this saga run is in progress elsewhere"),
            ),
            Halt::Refused { reason } => (ErrorCode::InvalidArgument, false, reason.clone()),
            Halt::Store => (
                ErrorCode::Unavailable,
                true,
                String::from("the receipt store failed; run the saga again"),
            ),
        };
        ToolError::new(code)
            .with_retryable(retryable)
            .with_hint(hint)
    }
}

impl fmt::Display for SagaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "saga halted: {:?}", self.halt)
    }
}

impl std::error::Error for SagaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match (&self.cause, &self.store) {
            (Some(c), _) => Some(c),
            (None, Some(s)) => Some(s),
            _ => None,
        }
    }
}

/// A saga: its steps, each through its own tool's stack, its decision recorded in a receipt
/// store. Made by [`Tools::saga`](crate::tool::Tools::saga); see the [module docs](super).
#[derive(Clone)]
pub struct Saga {
    name: Arc<str>,
    steps: Arc<[SagaStep]>,
    tools: ToolRouter<Value>,
    store: AnyStore,
    lease: Duration,
}

impl fmt::Debug for Saga {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saga")
            .field("name", &self.name)
            .field("steps", &self.steps)
            .finish()
    }
}

/// Who holds a saga run's lease: unique per run attempt in this process.
fn owner() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "saga-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// What a compensation is called with: the saga's arguments, with the step's answer under
/// `result` (so a compensation keyed on an argument field finds it at the top, as the step did);
/// arguments that are not an object go under `args`.
fn undo_args(args: &Value, done: Value) -> Value {
    match args {
        Value::Object(fields) if !fields.contains_key("result") => {
            let mut fields = fields.clone();
            fields.insert(String::from("result"), done);
            Value::Object(fields)
        }
        _ => json!({ "args": args, "result": done }),
    }
}

/// What a step's error means for the saga: an unknown outcome halts it for an operator; a
/// failure that may pass (retryable, or transient once the step's retries are spent: an outage, an
/// open breaker, a rate limit) pauses it; anything else fails the step for good.
///
/// An ambiguous failure that is not `outcome_unknown` is a keyed step whose retries were spent on
/// answers that may come after the work (a proxy's 502): the step may have happened, so it is not
/// undone as if it failed; the next run sends it again under the same key.
fn after_failure(err: &ToolError) -> Next {
    match err.code() {
        ErrorCode::OutcomeUnknown | ErrorCode::MissingIdempotencyKey => Next::Unknown,
        _ if err.retryable()
            || matches!(
                err.class(),
                Some(FailureClass::Transient | FailureClass::Ambiguous)
            ) =>
        {
            Next::Pause
        }
        _ => Next::Compensate,
    }
}

enum Next {
    Unknown,
    Pause,
    Compensate,
}

impl Saga {
    pub(crate) fn new(
        name: &str,
        steps: Vec<SagaStep>,
        tools: ToolRouter<Value>,
        store: AnyStore,
    ) -> Saga {
        Saga {
            name: Arc::from(name),
            steps: Arc::from(steps),
            tools,
            store,
            lease: Duration::from_secs(300),
        }
    }

    /// How long a runner holds a run before another may take it over after a crash (default
    /// five minutes: longer than the saga's longest run).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The saga's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs (or resumes) the run `run` of the saga with the model's `args`: every step's answer,
    /// in order, or why it stopped. Run it again with the same `run` and `args` after a crash,
    /// a pause or an operator's settlement: nothing done is done again.
    pub async fn run(&self, run: &str, args: Value) -> Result<Vec<Value>, SagaError> {
        let refused = |reason: String| Err(SagaError::new(Halt::Refused { reason }));
        let fingerprint = match Action::new(run, "-", &self.name, &args) {
            Ok(action) => action.fingerprint().to_owned(),
            Err(e) => return refused(format!("the run cannot be keyed: {e}")),
        };
        let key = decision_key(&self.name, run);
        let owner = owner();
        let begin = self
            .store
            .begin(&key, &fingerprint, &owner, self.lease)
            .await;
        let holding = match begin.map_err(|e| self.store_failed(e))? {
            Begin::Fresh => true,
            Begin::Pending {
                lease_left_ms: 0, ..
            } => {
                let claimed = self.store.claim(&key, &owner, self.lease).await;
                if !claimed.map_err(|e| self.store_failed(e))? {
                    return Err(self.halted(SagaError::new(Halt::InProgress)));
                }
                true
            }
            Begin::Pending { .. } => return Err(self.halted(SagaError::new(Halt::InProgress))),
            Begin::Done { receipt, .. } => match Decided::from_bytes(&receipt) {
                // Done before: every step answers from its receipt.
                Some(Decided::Completed) => false,
                Some(Decided::Compensate { failed, code }) => {
                    // A run again: the failed step's error as it was, from the record.
                    let cause =
                        ErrorCode::parse(&code).map(|c| ToolError::new(c).with_retryable(false));
                    return Err(self.compensate(run, &args, failed, cause, false).await);
                }
                None => return refused(String::from("the saga's record cannot be read")),
            },
            Begin::Mismatch { .. } => {
                return refused(String::from(
                    "this run of the saga was started with other arguments",
                ))
            }
        };
        telemetry::saga_event(&self.name, "started");
        let mut results = Vec::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate() {
            match self.call(&step.tool, run, args.clone()).await {
                Ok(answer) => {
                    telemetry::saga_event(&self.name, "step_done");
                    results.push(answer);
                }
                Err(err) => {
                    let next = after_failure(&err);
                    if let Next::Compensate = next {
                        let code = err.code().as_str().to_owned();
                        let decided = Decided::Compensate { failed: i, code }.to_bytes();
                        if let Err(e) = self.store.complete(&key, &owner, &decided).await {
                            let _ = self.store.release(&key, &owner, None).await;
                            return Err(self.store_failed(e));
                        }
                        return Err(self.compensate(run, &args, i, Some(err), true).await);
                    }
                    if holding {
                        // Nothing decided: the next run takes the lease at once.
                        let _ = self.store.release(&key, &owner, None).await;
                    }
                    let step = step.tool.clone();
                    let halt = match next {
                        Next::Unknown => Halt::OutcomeUnknown { step },
                        _ => Halt::Paused { step },
                    };
                    return Err(self.halted(SagaError::new(halt).because(err)));
                }
            }
        }
        if holding {
            let completed = Decided::Completed.to_bytes();
            if let Err(e) = self.store.complete(&key, &owner, &completed).await {
                // Every step is done and recorded in its own receipt: a later run answers from
                // them. Only the saga's own record is missing.
                tracing::warn!(saga = %self.name, run, error = %e, "the saga's completion was not recorded");
            }
        }
        telemetry::saga_event(&self.name, "completed");
        Ok(results)
    }

    /// Undoes the steps before `failed`, in reverse order; the error the run ends with. `first`:
    /// this run decided it (a run again goes over the same undo, and is not counted again).
    async fn compensate(
        &self,
        run: &str,
        args: &Value,
        failed: usize,
        cause: Option<ToolError>,
        first: bool,
    ) -> SagaError {
        if first {
            telemetry::saga_event(&self.name, "compensating");
        }
        let undo: Vec<(usize, &str)> = (0..failed.min(self.steps.len()))
            .rev()
            .filter_map(|i| Some((i, self.steps[i].compensation.as_deref()?)))
            .collect();
        for (n, (i, compensation)) in undo.iter().enumerate() {
            // The step's answer, from its receipt: it was done.
            let done = match self.call(&self.steps[*i].tool, run, args.clone()).await {
                Ok(answer) => answer,
                Err(err) if matches!(after_failure(&err), Next::Pause) => {
                    let step = self.steps[*i].tool.clone();
                    return self.halted(SagaError::new(Halt::Paused { step }).because(err));
                }
                Err(err) => return self.compensation_failed(compensation, &undo[n..], err),
            };
            if let Err(err) = self.call(compensation, run, undo_args(args, done)).await {
                let step = (*compensation).to_owned();
                match after_failure(&err) {
                    // The undo is decided and recorded: the next run continues it.
                    Next::Pause => {
                        return self.halted(SagaError::new(Halt::Paused { step }).because(err))
                    }
                    // The undo may have happened: an operator settles it, then the next run goes
                    // on (it is not "left to undo").
                    Next::Unknown => {
                        let halt = Halt::OutcomeUnknown { step };
                        return self.halted(SagaError::new(halt).because(err));
                    }
                    Next::Compensate => {}
                }
                return self.compensation_failed(compensation, &undo[n..], err);
            }
        }
        if first {
            telemetry::saga_event(&self.name, "compensated");
        }
        let step = self
            .steps
            .get(failed)
            .map_or_else(String::new, |s| s.tool.clone());
        let mut err = SagaError::new(Halt::Compensated { step });
        err.cause = cause;
        self.halted(err)
    }

    fn compensation_failed(&self, step: &str, left: &[(usize, &str)], err: ToolError) -> SagaError {
        let left = left.iter().map(|(_, c)| (*c).to_owned()).collect();
        let halt = Halt::CompensationFailed {
            step: step.to_owned(),
            left,
        };
        self.halted(SagaError::new(halt).because(err))
    }

    fn store_failed(&self, e: StoreError) -> SagaError {
        let mut err = SagaError::new(Halt::Store);
        err.store = Some(e);
        self.halted(err)
    }

    fn halted(&self, err: SagaError) -> SagaError {
        if !matches!(err.halt, Halt::Compensated { .. }) {
            telemetry::saga_event(&self.name, "halted");
            tracing::warn!(saga = %self.name, halt = ?err.halt, "saga halted");
        }
        err
    }

    async fn call(&self, tool: &str, run: &str, args: Value) -> Result<Value, ToolError> {
        let mut tools = self.tools.clone();
        let call = Call::new(run, tool, args).to(tool);
        std::future::poll_fn(|cx| tools.poll_ready(cx)).await?;
        tools.call(call).await
    }
}
