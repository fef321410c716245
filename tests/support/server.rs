//! A real HTTP/1.1 server on 127.0.0.1 (hyper), answering from a script, counting requests.
#![allow(dead_code, unreachable_pub)]

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use stormguard::error::BoxError;
use tower::Service;

pub type Body = Full<Bytes>;

/// Starts a server whose `n`-th request (from 0) is answered by `answer(n)`.
pub async fn serve(
    answer: impl Fn(u32) -> http::Response<Body> + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU32::new(0));
    let answer = Arc::new(answer);
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = answer.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let resp = answer(n);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, count)
}

/// Starts a server whose `n`-th request (from 0) is answered by `answer(n)` after `delay(n)`.
pub async fn serve_after(
    delay: impl Fn(u32) -> std::time::Duration + Send + Sync + 'static,
    answer: impl Fn(u32) -> http::Response<Body> + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU32::new(0));
    let (answer, delay) = (Arc::new(answer), Arc::new(delay));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (answer, delay, counter) = (answer.clone(), delay.clone(), counter.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let (resp, wait) = (answer(n), delay(n));
                    async move {
                        tokio::time::sleep(wait).await;
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, count)
}

pub fn status(code: u16, headers: &[(&str, &str)]) -> http::Response<Body> {
    let mut b = http::Response::builder().status(code);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

/// hyper's client as a `Clone` tower service.
#[derive(Clone)]
pub struct HttpClient(Client<HttpConnector, Body>);

impl HttpClient {
    pub fn new() -> Self {
        HttpClient(Client::builder(TokioExecutor::new()).build_http())
    }
}

impl Service<http::Request<Body>> for HttpClient {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { Ok(client.request(req).await?) })
    }
}

/// Starts a server like [`serve`] that also records each request's `idempotency-key` header.
pub async fn serve_keys(
    answer: impl Fn(u32) -> http::Response<Body> + Send + Sync + 'static,
) -> (
    SocketAddr,
    Arc<AtomicU32>,
    Arc<std::sync::Mutex<Vec<Option<String>>>>,
) {
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU32::new(0));
    let answer = Arc::new(answer);
    let (counter, seen) = (count.clone(), keys.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (answer, counter, seen) = (answer.clone(), counter.clone(), seen.clone());
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let key = req
                            .headers()
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        seen.lock().unwrap().push(key);
                        let resp = answer(counter.fetch_add(1, Ordering::SeqCst));
                        async move { Ok::<_, Infallible>(resp) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, count, keys)
}
