//! The agent of an episode: the script's steps through the toolbox's stacks, the model's
//! reissues, reworded repeats and parallel branches, until the script ends or the process
//! crashes.

use super::episodes::{Harness, Progress, Report};
use super::provider::{unit, Provider};
use crate::classify::OkIsSuccess;
use crate::error::{ErrorCode, ToolError};
use crate::tool::{Call, SpecError, Tools};
use serde_json::Value;
use std::future::Future;
use tower_layer::Layer;
use tower_service::Service;

/// How a process's part of an episode ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The script ran to its end.
    Done,
    /// The process crashed (in-process mode): a new one resumes from `progress`.
    Crashed,
}

impl Harness {
    /// The agent's loop over the script from where `progress` stands: each step through its
    /// tool's stack, reissued by the model at its next step when it failed in a way it may
    /// retry, asked for again now and then when it succeeded, and made by two branches at once
    /// now and then (all drawn from `seed` and the step). `checkpoint` is told after each step,
    /// as an agent framework records its progress; a crash leaves the step unrecorded, so the
    /// process that resumes makes it again with the same step id.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn steps(
        &self,
        run: &str,
        seed: u64,
        provider: &Provider,
        tools: Tools,
        progress: &mut Progress,
        report: &mut Report,
        mut checkpoint: impl FnMut(&Progress),
    ) -> Result<Ended, SpecError> {
        let mut seen = |name: &str| *report.faults.entry(name.to_owned()).or_default() += 1;
        for (i, step) in self.script.iter().enumerate().skip(progress.outcomes.len()) {
            let draw = |salt: u64| unit(seed, 1_000 + 4 * i as u64 + salt);
            let recorded_turn = progress.turn;
            let mut reissues = 0;
            progress.turn += 1;
            provider.step(i);
            let outcome = loop {
                let call = |turn: u32, args: &Value| step.call(run, turn, args);
                let first = call(progress.turn, &step.args);
                let sent = if draw(0) < self.parallel && reissues == 0 {
                    // Two branches of the agent make the same call at once.
                    seen("parallel");
                    progress.turn += 1;
                    let second = call(progress.turn, &step.args);
                    let both = async {
                        let (a, b) = join(
                            self.call(&tools, provider, &step.tool, first),
                            self.call(&tools, provider, &step.tool, second),
                        )
                        .await;
                        a.or(b)
                    };
                    until_crash(provider, both).await
                } else {
                    until_crash(provider, self.call(&tools, provider, &step.tool, first)).await
                };
                match sent {
                    None => {
                        progress.turn = recorded_turn;
                        return Ok(Ended::Crashed);
                    }
                    Some(Ok(_)) => break Ok(()),
                    Some(Err(e)) if e.retryable() && reissues < self.reissues => {
                        // The model reissues it at its next step.
                        reissues += 1;
                        progress.turn += 1;
                    }
                    Some(Err(e))
                        if reissues < self.reissues
                            && draw(2 + 4 * u64::from(reissues + 1) * 1_000) < self.defiant
                            && e.code() != ErrorCode::Internal =>
                    {
                        // Told not to retry, the model reissues it anyway.
                        seen("defied");
                        reissues += 1;
                        progress.turn += 1;
                    }
                    Some(Err(e)) => break Err(e.code().as_str().to_owned()),
                }
            };
            let succeeded = outcome.is_ok();
            progress.outcomes.push(outcome);
            checkpoint(progress);
            if succeeded && draw(1) < self.rewords {
                // The transcript lost the answer: the model asks for the same thing again.
                seen("reworded");
                progress.turn += 1;
                let args = step.reworded.as_ref().unwrap_or(&step.args);
                let again = step.call(run, progress.turn, args);
                if until_crash(provider, self.call(&tools, provider, &step.tool, again))
                    .await
                    .is_none()
                {
                    return Ok(Ended::Crashed);
                }
                checkpoint(progress);
            }
        }
        Ok(Ended::Done)
    }

    /// One call through the tool's stack over the provider.
    async fn call(
        &self,
        tools: &Tools,
        provider: &Provider,
        tool: &str,
        call: Call,
    ) -> Result<Value, ToolError> {
        let body = provider.clone();
        let refused = |e: SpecError| ToolError::new(ErrorCode::Internal).with_hint(e.to_string());
        if self.reads_back(tool) {
            let layer = tools
                .layer_reading_back(tool, provider.clone())
                .map_err(refused)?;
            send(layer.classifier(OkIsSuccess).layer(body), call).await
        } else {
            let layer = tools.layer(tool).map_err(refused)?;
            send(layer.classifier(OkIsSuccess).layer(body), call).await
        }
    }
}

async fn send<S>(mut stack: S, call: Call) -> Result<Value, ToolError>
where
    S: Service<Call, Response = Value, Error = ToolError>,
{
    std::future::poll_fn(|cx| stack.poll_ready(cx)).await?;
    stack.call(call).await
}

/// `work`'s output, or `None` if the provider crashed the process first: then `work` is leaked,
/// not dropped, so no destructor runs (no lease given up, no intent settled), as after SIGKILL.
async fn until_crash<F: Future>(provider: &Provider, work: F) -> Option<F::Output> {
    let mut work = Box::pin(work);
    let crash = provider.crash();
    let mut crash = std::pin::pin!(crash);
    let out = std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(out) = work.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(out));
        }
        crash.as_mut().poll(cx).map(|()| None)
    })
    .await;
    if out.is_none() {
        std::mem::forget(work);
    }
    out
}

/// Both futures' outputs, polled together (two branches of the agent at once).
async fn join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut out_a, mut out_b) = (None, None);
    std::future::poll_fn(|cx| {
        if out_a.is_none() {
            if let std::task::Poll::Ready(v) = a.as_mut().poll(cx) {
                out_a = Some(v);
            }
        }
        if out_b.is_none() {
            if let std::task::Poll::Ready(v) = b.as_mut().poll(cx) {
                out_b = Some(v);
            }
        }
        match (out_a.take(), out_b.take()) {
            (Some(a), Some(b)) => std::task::Poll::Ready((a, b)),
            (a, b) => {
                (out_a, out_b) = (a, b);
                std::task::Poll::Pending
            }
        }
    })
    .await
}
