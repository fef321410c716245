//! The breaker's futures and what a streamed answer carries: [`ResponseFuture`], one call
//! through the breaker, with its outcome recorded on completion; [`KeyedBreakerFuture`], one call
//! through the breaker its request names; [`StreamTicket`], the claim a streamed answer's body
//! carries until its end is counted; [`Watched`], the response type the breaker hands on.
//!
//! Each item has an example: [`ResponseFuture`]'s shows a call's future by name,
//! [`StreamTicket`]'s a stream counted at its end.

use super::policy::{Count, CountPolicy};
use super::state::{Admission, Admit, Breaker};
use crate::classify::{Classification, ClassifiedResponse, Classify, StreamEnd, WatchStream};
use crate::error::{BoxError, ToolError};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tower_service::Service;

/// An admitted call's claim on the breaker. Dropped before the call completes (a cancelled
/// trial), it gives the trial permit back, so a cancelled trial cannot wedge the breaker.
pub(super) struct Ticket {
    pub(super) breaker: Breaker,
    pub(super) admission: Admission,
    /// When the call started (for the slow-call rule), as `Breaker::now_tick`; 0 when untimed.
    started: u64,
}

impl Ticket {
    pub(super) fn new(breaker: Breaker, admission: Admission) -> Ticket {
        Ticket {
            breaker,
            admission,
            started: 0,
        }
    }

    /// Starts the slow-call clock as the call is made (not when it was admitted: a trial
    /// admitted in `poll_ready` may wait there for the inner service).
    pub(super) fn start(&mut self) {
        if self.breaker.machine.config.slow_call.is_some() {
            self.started = self.breaker.now_tick();
        }
    }

    /// Whether the call is slow by now (the slow-call rule; never without one).
    fn slow(&self) -> bool {
        self.breaker.machine.config.slow_call.is_some_and(|slow| {
            self.started != 0 && Duration::from_nanos(self.breaker.now_tick() - self.started) > slow
        })
    }

    fn settle(&mut self, count: Count) {
        let count = match count {
            Count::Success if self.slow() => Count::Failure,
            count => count,
        };
        self.record(count);
    }

    fn record(&mut self, count: Count) {
        // Settled: what is left to drop holds no permit (a rejection gives nothing back).
        let admission = std::mem::replace(&mut self.admission, Admission::rejected(0));
        self.breaker.record(admission, count);
    }
}

/// A streamed call's claim on the breaker, carried by its response body until the stream ends:
/// then the end's verdict is counted (a trial settles the breaker's state). Dropped untold (the
/// caller dropped the stream), it counts nothing and gives a trial permit back.
///
/// ```
/// use bytes::Bytes;
/// use http_body::Frame;
/// use http_body_util::{BodyExt, StreamBody};
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, CountDependencyFailures, State};
/// use stormguard::breaker::future::StreamTicket;
/// use stormguard::classify::{ClassifiedBody, GrpcClassifier, GrpcEos};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let config = BreakerConfig::builder().consecutive_failures(1).no_failure_rate().build().unwrap();
/// let breaker = Breaker::new("watch", config);
/// // A gRPC stream: one message, then UNAVAILABLE in its trailers.
/// let grpc = service_fn(|_: ()| async {
///     let mut trailers = http::HeaderMap::new();
///     trailers.insert("grpc-status", "14".parse().unwrap());
///     let frames = vec![Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"msg"))), Ok(Frame::trailers(trailers))];
///     let body = StreamBody::new(futures_util::stream::iter(frames));
///     Ok::<_, std::io::Error>(http::Response::builder().header("content-type", "application/grpc").body(body).unwrap())
/// });
/// let mut svc = CircuitBreakerLayer::new(breaker.clone()).classifier(GrpcClassifier).layer(grpc);
/// let res = svc.ready().await.unwrap().call(()).await.unwrap();
/// // The head counts nothing: the body carries the call's ticket.
/// let body: &ClassifiedBody<_, GrpcEos, StreamTicket<CountDependencyFailures>> = res.body();
/// assert!(body.is_watching());
/// assert_eq!(breaker.state(), State::Closed);
/// // Read to its end, the stream's failure is counted.
/// res.into_body().collect().await.unwrap();
/// assert_eq!(breaker.state(), State::Open);
/// # }
/// ```
pub struct StreamTicket<P> {
    ticket: Ticket,
    policy: P,
    /// Slow at the head already (the slow-call rule times the head, not the whole stream).
    slow: bool,
}

impl<P: CountPolicy> StreamEnd for StreamTicket<P> {
    fn ended(mut self, outcome: Classification) {
        let count = match self.policy.count(&outcome) {
            Count::Success if self.slow => Count::Failure,
            count => count,
        };
        self.ticket.record(count);
    }
}

impl<P> fmt::Debug for StreamTicket<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamTicket")
            .field("breaker", &self.ticket.breaker.name())
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// A ticket that holds nothing, left behind when the real one goes with a stream.
    fn settled(from: &Ticket) -> Ticket {
        Ticket::new(from.breaker.clone(), Admission::rejected(0))
    }

    fn is_trial(&self) -> bool {
        matches!(self.admission.view(), Admit::Trial(_))
    }

    /// A half-open trial whose answer is a stream is judged at its head: the dependency
    /// answered (in time: the trial timeout bounds the wait for the head, not the stream, which
    /// may rightly last minutes). Its end is then counted like any call's, with a ticket of the
    /// state the trial left (nothing, unless the breaker closed).
    fn stream_trial_answered(&mut self, slow: bool) -> Ticket {
        self.record(if slow { Count::Failure } else { Count::Success });
        let breaker = self.breaker.clone();
        let admission = breaker.admit();
        match admission.view() {
            Admit::Closed(_) => Ticket::new(breaker, admission),
            Admit::Trial(_) => {
                // Still half-open (more trials needed): the end says nothing more.
                breaker.release(admission);
                Ticket::settled(self)
            }
            Admit::Rejected(_) => Ticket::settled(self),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Only an unsettled trial holds anything to give back.
        self.breaker.release(self.admission);
    }
}

pin_project! {
    /// The future [`CircuitBreaker`](super::CircuitBreaker) returns: the inner call's, whose
    /// outcome is recorded when it completes, or a `circuit_open` rejection ready at once.
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
    /// use stormguard::breaker::future::ResponseFuture;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let breaker = Breaker::new("search", BreakerConfig::default());
    /// let inner = service_fn(|q: &'static str| async move { Ok::<_, std::io::Error>(q.len()) });
    /// let mut svc = CircuitBreakerLayer::new(breaker).layer(inner);
    /// let future: ResponseFuture<_, _, _> = svc.ready().await.unwrap().call("storm");
    /// assert_eq!(future.await.unwrap(), 5);
    /// # }
    /// ```
    pub struct ResponseFuture<F, C, P> {
        #[pin]
        state: State<F>,
        classifier: C,
        policy: P,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F, ticket: Ticket },
        Rejected { error: Option<ToolError> },
    }
}

impl<F, C, P> ResponseFuture<F, C, P> {
    pub(super) fn called(future: F, ticket: Ticket, classifier: C, policy: P) -> Self {
        ResponseFuture {
            state: State::Called { future, ticket },
            classifier,
            policy,
        }
    }

    pub(super) fn rejected(error: ToolError, classifier: C, policy: P) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
            classifier,
            policy,
        }
    }
}

/// The response a [`CircuitBreaker`](super::CircuitBreaker) hands on: the inner response, or
/// (for a classifier that decides at the end of a stream) the same response watched until then
/// (see [`StreamTicket`] for that case).
///
/// ```
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::breaker::future::Watched;
/// use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, CountDependencyFailures};
/// use stormguard::classify::DefaultClassifier;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::new("search", BreakerConfig::default());
/// let inner = service_fn(|q: &'static str| async move { Ok::<_, std::io::Error>(q.len()) });
/// let mut svc = CircuitBreakerLayer::new(breaker).layer(inner);
/// // A classifier that decides at the head: the watched response is the inner one, as it is.
/// let res: Watched<DefaultClassifier, usize, std::io::Error, CountDependencyFailures> =
///     svc.ready().await.unwrap().call("storm").await.unwrap();
/// assert_eq!(res, 5);
/// # }
/// ```
pub type Watched<C, Res, E, P> =
    <<C as Classify<Res, E>>::ClassifyEos as WatchStream<Res>>::Watched<StreamTicket<P>>;

impl<F, C, P, Res, E> Future for ResponseFuture<F, C, P>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    C: Classify<Res, E>,
    P: CountPolicy + Clone,
{
    type Output = Result<Watched<C, Res, E, P>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Called { future, ticket } => {
                let result = ready!(future.poll(cx));
                let eos = match this.classifier.classify(&result) {
                    ClassifiedResponse::Ready(c) => {
                        ticket.settle(this.policy.count(&c));
                        None
                    }
                    ClassifiedResponse::RequiresEos(eos) => Some(eos),
                };
                Poll::Ready(match (result, eos) {
                    (Ok(res), None) => Ok(C::ClassifyEos::pass(res)),
                    (Ok(res), Some(eos)) => {
                        // The verdict comes at the end of the stream: the ticket goes with it.
                        let slow = ticket.slow();
                        let ticket = if ticket.is_trial() {
                            ticket.stream_trial_answered(slow)
                        } else {
                            std::mem::replace(ticket, Ticket::settled(ticket))
                        };
                        Ok(eos.watch(
                            res,
                            StreamTicket {
                                ticket,
                                policy: this.policy.clone(),
                                slow,
                            },
                        ))
                    }
                    // An error with no verdict yet is no evidence either way.
                    (Err(e), Some(_)) => {
                        ticket.record(Count::Ignore);
                        Err(e.into())
                    }
                    (Err(e), None) => Err(e.into()),
                })
            }
            StateProj::Rejected { error } => Poll::Ready(Err(match error.take() {
                Some(e) => Box::new(e),
                None => "circuit breaker future polled after completion".into(),
            })),
        }
    }
}

impl<F, C, P> fmt::Debug for ResponseFuture<F, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

pub(super) fn retry_after_hint(breaker: &Breaker, after: Duration) -> String {
    let reason = breaker.reason();
    // Said as `retry_after` says it: milliseconds below ten seconds, else whole seconds.
    let wait = if after < Duration::from_secs(10) {
        format!("{} ms", after.as_millis().max(1))
    } else {
        format!("{} s", after.as_secs_f64().ceil() as u64)
    };
    if reason.is_empty() {
        format!(
            "calls to {} are paused after repeated failures; retry after {wait}",
            breaker.name()
        )
    } else {
        format!("{reason}; calls are paused, retry after {wait}")
    }
}

pin_project! {
    /// The future of [`KeyedBreaker`](super::KeyedBreaker): the key's breaker admits (or
    /// rejects) once the inner service is ready, then the call is counted as
    /// [`CircuitBreaker`](super::CircuitBreaker) counts it.
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::breaker::{BreakerConfig, BreakerRegistry, KeyedBreakerLayer};
    /// use stormguard::breaker::future::KeyedBreakerFuture;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let registry = BreakerRegistry::new(BreakerConfig::default());
    /// let api = service_fn(|model: &'static str| async move { Ok::<_, std::io::Error>(model.len()) });
    /// let mut svc = KeyedBreakerLayer::new(registry.clone(), |model: &&'static str| *model).layer(api);
    /// let future: KeyedBreakerFuture<_, _, _, &'static str> = svc.ready().await.unwrap().call("model-a");
    /// assert_eq!(future.await.unwrap(), 7);
    /// assert_eq!(registry.names(), vec!["model-a".to_string()]);
    /// # }
    /// ```
    pub struct KeyedBreakerFuture<S: Service<Req>, C, P, Req> {
        #[pin]
        state: KeyedState<S, C, P, Req>,
    }
}

pin_project! {
    #[project = KeyedProj]
    enum KeyedState<S: Service<Req>, C, P, Req> {
        Ready { guarded: super::CircuitBreaker<S, C, P>, request: Option<Req> },
        Called { #[pin] future: ResponseFuture<S::Future, C, P> },
    }
}

impl<S: Service<Req>, C, P, Req> KeyedBreakerFuture<S, C, P, Req> {
    /// Drives `guarded` ready, then calls it with `request`.
    pub(super) fn new(guarded: super::CircuitBreaker<S, C, P>, request: Req) -> Self {
        KeyedBreakerFuture {
            state: KeyedState::Ready {
                guarded,
                request: Some(request),
            },
        }
    }
}

impl<S, C, P, Req> Future for KeyedBreakerFuture<S, C, P, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error> + Clone,
    P: super::CountPolicy + Clone,
{
    type Output = Result<Watched<C, S::Response, S::Error, P>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                KeyedProj::Ready { guarded, request } => {
                    ready!(guarded.poll_ready(cx))?;
                    let req = request.take().expect("polled after completion");
                    let future = guarded.call(req);
                    this.state.set(KeyedState::Called { future });
                }
                KeyedProj::Called { future } => return future.poll(cx),
            }
        }
    }
}

impl<S: Service<Req>, C, P, Req> fmt::Debug for KeyedBreakerFuture<S, C, P, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreakerFuture").finish_non_exhaustive()
    }
}
