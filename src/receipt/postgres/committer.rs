//! Group commit on one connection: the calls queued while a transaction was committing run
//! together in the next one, so many writers share one WAL flush.
//!
//! Each pool slot has a committer task that owns its connection. A call is queued to it when
//! it is made (so one key's calls, always on one slot, run in the order they were made); the
//! task takes what is queued, runs a lone call in autocommit (no transaction to pay for) and
//! several in one transaction, `BEGIN` and their statements pipelined in one write, then
//! `COMMIT` (with `Durability::Process`, whose commits wait for no flush, each call commits on
//! its own, still pipelined). If the transaction fails (a lock
//! timeout, a deadlock) nothing of it took effect, and each call runs again alone; if the
//! connection dies before the commit is confirmed, the calls are answered with an error (their
//! outcome is unknown to the caller, as any lost reply is) and the next batch reconnects.

use super::{open, Conn, PostgresOptions};
use crate::receipt::store::{Durability, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// The most calls one transaction carries.
const MAX_BATCH: usize = 64;

type Running = Pin<Box<dyn Future<Output = bool> + Send>>;

/// A queued call, type-erased: run it (again, if its batch rolled back), then answer it.
trait Job: Send {
    fn run(&self, conn: Arc<Conn>, now: Option<i64>) -> Running;
    fn deliver(self: Box<Self>, failed: Option<&str>);
}

struct Typed<T, F> {
    work: F,
    result: Arc<Mutex<Option<Result<T, StoreError>>>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F, Fut> Job for Typed<T, F>
where
    T: Send + 'static,
    F: Fn(Arc<Conn>, Option<i64>) -> Fut + Send,
    Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    fn run(&self, conn: Arc<Conn>, now: Option<i64>) -> Running {
        let running = (self.work)(conn, now);
        let slot = self.result.clone();
        Box::pin(async move {
            let result = running.await;
            let ok = result.is_ok();
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
            ok
        })
    }

    fn deliver(self: Box<Self>, failed: Option<&str>) {
        let result = match failed {
            Some(why) => Err(StoreError::new(why.to_string())),
            None => self
                .result
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_else(|| Err(StoreError::new("the call was never run"))),
        };
        let _ = self.reply.send(result);
    }
}

/// One pool slot: the queue to its committer task.
pub(super) struct Slot {
    jobs: mpsc::UnboundedSender<Box<dyn Job>>,
}

impl Slot {
    /// A slot whose task starts with `conn` (or opens one at its first batch).
    pub(super) fn start(options: PostgresOptions, conn: Option<Arc<Conn>>) -> Slot {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(committer(options, conn, queue));
        Slot { jobs }
    }

    /// Queues `work` now and answers once its transaction has committed. `work` may run twice
    /// (a rolled-back batch runs each call again alone): it must be one that a rollback undoes.
    pub(super) fn submit<T, F, Fut>(
        &self,
        work: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: Fn(Arc<Conn>, Option<i64>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Typed {
            work,
            result: Arc::default(),
            reply,
        });
        let queued = self.jobs.send(job).is_ok();
        async move {
            if !queued {
                return Err(StoreError::new("the store's committer has stopped"));
            }
            answer
                .await
                .map_err(|_| StoreError::new("the store's committer stopped before answering"))?
        }
    }
}

async fn committer(
    options: PostgresOptions,
    mut conn: Option<Arc<Conn>>,
    mut queue: mpsc::UnboundedReceiver<Box<dyn Job>>,
) {
    let now = || {
        options
            .clock
            .as_ref()
            .map(|c| i64::try_from(c.now_ms()).unwrap_or(i64::MAX))
    };
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let live = match conn.as_ref().filter(|c| !c.client.is_closed()) {
            Some(c) => c.clone(),
            None => {
                if conn.is_some() {
                    tracing::info!("receipt store connection was closed; reconnecting");
                }
                match open(&options).await {
                    Ok(c) => {
                        conn = Some(c.clone());
                        c
                    }
                    Err(e) => {
                        let why = e.to_string();
                        for job in batch {
                            job.deliver(Some(&why));
                        }
                        continue;
                    }
                }
            }
        };
        if batch.len() == 1 {
            for job in batch {
                job.run(live.clone(), now()).await;
                job.deliver(None);
            }
            continue;
        }
        if options.durability == Durability::Process {
            // A commit waits for no flush: each call commits on its own, all pipelined.
            let at = now();
            let runs: Vec<Running> = batch.iter().map(|job| job.run(live.clone(), at)).collect();
            join_all(runs.into_iter()).await;
            for job in batch {
                job.deliver(None);
            }
            continue;
        }
        // `BEGIN` goes out in the same write as the calls' first statements (one round trip
        // fewer per batch); the server runs them in order, so they run inside it.
        let opener = live.clone();
        let begin: Running =
            Box::pin(async move { opener.client.batch_execute("BEGIN").await.is_ok() });
        let at = now();
        let runs: Vec<Running> = std::iter::once(begin)
            .chain(batch.iter().map(|job| job.run(live.clone(), at)))
            .collect();
        let done = join_all(runs.into_iter()).await;
        if !done[0] && !live.client.is_closed() {
            // No transaction was opened, so each statement committed (or failed) on its own,
            // as a lone call's does: each call's answer is what it saw.
            for job in batch {
                job.deliver(None);
            }
            continue;
        }
        let ok = done.iter().all(|&d| d);
        if ok && live.client.batch_execute("COMMIT").await.is_ok() {
            for job in batch {
                job.deliver(None);
            }
            continue;
        }
        let _ = live.client.batch_execute("ROLLBACK").await;
        if live.client.is_closed() {
            for job in batch {
                job.deliver(Some(
                    "the connection closed before the commit was confirmed",
                ));
            }
            continue;
        }
        // Rolled back: nothing of the batch took effect. Each call runs again on its own.
        for job in batch {
            job.run(live.clone(), now()).await;
            job.deliver(None);
        }
    }
}

/// Polls every future until all are done; their statements go out in order (tokio-postgres
/// sends a request at its future's first poll), pipelined on the connection.
async fn join_all(futures: impl Iterator<Item = Running>) -> Vec<bool> {
    let mut running: Vec<Option<Running>> = futures.map(Some).collect();
    let mut done = vec![false; running.len()];
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, slot) in running.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(ok) => {
                        done[i] = ok;
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    done
}
