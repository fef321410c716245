//! The worked example of the reference text, crash included: an invoice run of three steps whose
//! process is killed (SIGKILL) after the email provider accepted the send and before the run
//! recorded it, then resumed. Shared by `examples/invoice/main.rs` and `tests/crash.rs`.
//!
//! The parent process runs an email provider on 127.0.0.1 that honours `Idempotency-Key` and
//! counts deliveries, starts the run as a child process, kills it with SIGKILL as soon as the
//! provider has accepted the send (the child is then in the window before its receipt or
//! checkpoint is written), and starts it again to resume.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stormguard::classify::HttpStatusError;
use stormguard::error::BoxError;
use stormguard::key::{IdempotencyKey, KeyStamp};
use stormguard::receipt::{Durability, SqliteStore};
use stormguard::tool::{Call, Stores, ToolService, Toolbox};
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};

/// The ways of running the steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path_ {
    /// No key, no receipt: a checkpoint after each step, as many agent harnesses do.
    Naive,
    /// stormguard: intent, key, receipt (SQLite).
    Receipts,
    /// No crash: the provider (taking no key) sends the email, then a proxy in front of it
    /// answers 503; the client retries the 503 as a transient failure.
    Naive503,
    /// The same 503, with stormguard: `send_invoice` declared an unkeyed write with receipts.
    Receipts503,
}

impl Path_ {
    pub fn name(self) -> &'static str {
        match self {
            Path_::Naive => "naive",
            Path_::Receipts => "receipts",
            Path_::Naive503 => "naive-503",
            Path_::Receipts503 => "receipts-503",
        }
    }

    pub fn parse(s: &str) -> Option<Path_> {
        match s {
            "naive" => Some(Path_::Naive),
            "receipts" => Some(Path_::Receipts),
            "naive-503" => Some(Path_::Naive503),
            "receipts-503" => Some(Path_::Receipts503),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The email provider: honours Idempotency-Key, counts deliveries, tells the parent of each send.

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Email {
    pub invoice_id: u64,
    pub to: String,
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Accepted {
    pub message_id: String,
}

// Its receipt is its JSON.
stormguard::stored_as_json!(Accepted);

/// Every accepted send is a success (the client maps a failure status to an error).
impl stormguard::classify::Answer for Accepted {}

#[derive(Clone, Debug)]
pub struct ProviderEvent {
    pub at: Duration,
    pub key: Option<String>,
    pub delivered: bool,
    pub message_id: String,
}

#[derive(Default)]
struct ProviderState {
    deliveries: u32,
    by_key: HashMap<String, Accepted>,
    /// Sends still to be answered 503 by the proxy after the provider delivered them.
    proxy_resets: u32,
    /// A provider that takes no idempotency key.
    ignores_keys: bool,
}

pub struct Provider {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProviderState>>,
    pub events: mpsc::UnboundedReceiver<ProviderEvent>,
}

impl Provider {
    pub fn deliveries(&self) -> u32 {
        self.state.lock().unwrap().deliveries
    }

    /// From now on: a provider that takes no key, behind a proxy that answers the next send with
    /// 503 after forwarding it (an upstream reset).
    pub fn unkeyed_behind_a_resetting_proxy(&self) {
        let mut s = self.state.lock().unwrap();
        s.ignores_keys = true;
        s.proxy_resets = 1;
    }
}

pub async fn start_provider(started: Instant) -> Provider {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = Arc::new(Mutex::new(ProviderState::default()));
    let (tx, events) = mpsc::unbounded_channel();
    let shared = state.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (state, tx) = (shared.clone(), tx.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| {
                        let (state, tx) = (state.clone(), tx.clone());
                        async move {
                            let key = req
                                .headers()
                                .get("idempotency-key")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string);
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let email: Email = match serde_json::from_slice(&body) {
                                Ok(email) => email,
                                Err(_) => {
                                    return Ok::<_, Infallible>(json_response(
                                        400,
                                        &serde_json::json!({"error": "bad email"}),
                                    ))
                                }
                            };
                            let (accepted, delivered, reset) = {
                                let mut s = state.lock().unwrap();
                                let key = key.as_ref().filter(|_| !s.ignores_keys);
                                let reset = s.proxy_resets > 0;
                                s.proxy_resets = s.proxy_resets.saturating_sub(1);
                                let (accepted, delivered) =
                                    match key.and_then(|k| s.by_key.get(k)).cloned() {
                                        Some(stored) => (stored, false),
                                        None => {
                                            s.deliveries += 1;
                                            let accepted = Accepted {
                                                message_id: format!(
                                                    "msg-{}-{}",
                                                    email.invoice_id, s.deliveries
                                                ),
                                            };
                                            if let Some(k) = key {
                                                s.by_key.insert(k.clone(), accepted.clone());
                                            }
                                            (accepted, true)
                                        }
                                    };
                                (accepted, delivered, reset)
                            };
                            let _ = tx.send(ProviderEvent {
                                at: started.elapsed(),
                                key,
                                delivered,
                                message_id: accepted.message_id.clone(),
                            });
                            if reset {
                                // The proxy lost the upstream connection after forwarding.
                                return Ok(json_response(
                                    503,
                                    &serde_json::json!({"error": "upstream connect error or disconnect/reset before headers"}),
                                ));
                            }
                            Ok(json_response(200, &accepted))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Provider {
        addr,
        state,
        events,
    }
}

fn json_response(status: u16, body: &impl Serialize) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(body).unwrap_or_default(),
        )))
        .expect("response")
}

// ---------------------------------------------------------------------------------------------
// The child: the agent run.

/// The send_invoice tool's request.
#[derive(Clone, Debug)]
pub struct SendInvoice {
    pub email: Email,
    pub key: Option<String>,
}

/// Sent again as a clone: it carries no operation of its own.
impl stormguard::retry::Request for SendInvoice {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl KeyStamp for SendInvoice {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

/// Sends the email over HTTP, then lingers `crash_window` before returning: the moment after
/// the provider accepted the send and before the run records it.
#[derive(Clone)]
pub struct EmailClient {
    client: Client<HttpConnector, Full<Bytes>>,
    provider: SocketAddr,
    crash_window: Duration,
    /// Whether to print the send's events (the child's stdout is read by the parent).
    report: bool,
}

impl Service<SendInvoice> for EmailClient {
    type Response = Accepted;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Accepted, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: SendInvoice) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let mut b = http::Request::post(format!("http://{}/send", this.provider))
                .header("content-type", "application/json");
            if let Some(key) = &req.key {
                b = b.header("idempotency-key", key.as_str());
            }
            let resp = this
                .client
                .request(b.body(Full::new(Bytes::from(serde_json::to_vec(&req.email)?)))?)
                .await?;
            // A failure status becomes the error, status, headers and all: the classifiers read
            // it as the answer itself (503 is ambiguous; `Retry-After` is the server's delay).
            if !resp.status().is_success() {
                if this.report {
                    emit(
                        &serde_json::json!({"event": "send_failed", "status": resp.status().as_u16()}),
                    );
                }
                let (parts, body) = resp.into_parts();
                let body = body.collect().await?.to_bytes();
                let err =
                    HttpStatusError::new(parts.status, parts.headers).with_body_excerpt(&body);
                return Err(Box::new(err) as BoxError);
            }
            let body = resp.into_body().collect().await?.to_bytes();
            let accepted: Accepted = serde_json::from_slice(&body)?;
            if this.report {
                emit(
                    &serde_json::json!({"event": "send_returned", "message_id": accepted.message_id}),
                );
            }
            tokio::time::sleep(this.crash_window).await;
            Ok(accepted)
        })
    }
}

pub fn emit(event: &serde_json::Value) {
    println!("{event}");
}

#[derive(Default, Serialize, Deserialize)]
struct Checkpoint {
    done: Vec<u32>,
}

fn load_checkpoint(dir: &Path) -> Checkpoint {
    std::fs::read(dir.join("checkpoint.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save_checkpoint(dir: &Path, cp: &Checkpoint) {
    let tmp = dir.join("checkpoint.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(cp).expect("json")).expect("write checkpoint");
    std::fs::rename(tmp, dir.join("checkpoint.json")).expect("rename checkpoint");
}

/// The model writes the email; its wording differs from one attempt to the next.
fn model_writes_body(invoice_id: u64) -> String {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let greeting = ["Dear customer", "Hello", "Hi there", "Good day"][(nonce % 4) as usize];
    format!("{greeting}, please find invoice #{invoice_id} attached. (draft {nonce})")
}

pub const RUN: &str = "run-81f2";
pub const INVOICE: u64 = 4471;

/// `send_invoice`, declared once, as each path's provider takes it: `keyed` (the provider
/// honours `Idempotency-Key`: a resume sends it again under its key) or not (an unkeyed write:
/// an unknown outcome is escalated). Nobody retries it automatically (the resume is the only
/// second attempt). Its key covers the run, the tool and the invoice, never the model's wording;
/// receipts in SQLite, with a short lease for the demo (a resume waits it out).
fn send_invoice_tool(keyed: bool) -> Toolbox {
    let (class, retry) = if keyed {
        ("keyed_write", "none")
    } else {
        ("unkeyed_write", "none")
    };
    Toolbox::from_json_str(&format!(
        r#"{{
        "stores": {{ "receipts": {{ "kind": "sqlite", "retention_secs": 604800 }} }},
        "tools": [{{
            "name": "send_invoice", "class": "{class}", "retry": ["{retry}"],
            "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
            "receipt": {{ "store": "receipts", "provider_key_window_secs": 86400, "lease_secs": 2 }}
        }}]
    }}"#
    ))
    .expect("the tool table is valid")
}

/// The declared `send_invoice` over `client`, its receipts in `dir/receipts.db`.
fn send_invoice_stack(
    keyed: bool,
    dir: &Path,
    client: EmailClient,
) -> Result<ToolService<Accepted>, BoxError> {
    let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
    let tools = send_invoice_tool(keyed).build(Stores::new().with("receipts", store))?;
    // The call's arguments are the email; the key its stack stamped goes on the request.
    let body = tower::service_fn(move |call: Call| {
        let email: Result<Email, _> = serde_json::from_value(call.args().clone());
        let key = call.key().map(|k| k.to_string());
        let client = client.clone();
        async move { client.oneshot(SendInvoice { email: email?, key }).await }
    });
    Ok(tools.layer("send_invoice")?.layer(body))
}

fn send_invoice_call(email: &Email) -> Call {
    Call::new(
        RUN,
        "step-2",
        serde_json::to_value(email).expect("an email is JSON"),
    )
}

/// One run (or resume) of the three steps. The crash window is open on the first run only.
pub async fn child(
    path: Path_,
    provider: SocketAddr,
    dir: PathBuf,
    crash_window: Duration,
) -> Result<(), BoxError> {
    let mut cp = load_checkpoint(&dir);
    emit(&serde_json::json!({"event": "start", "path": path.name(), "checkpoint": cp.done}));
    let client = EmailClient {
        client: Client::builder(TokioExecutor::new()).build_http(),
        provider,
        crash_window,
        report: true,
    };
    // Step 1: create the invoice (a local, idempotent write).
    if !cp.done.contains(&1) {
        std::fs::write(
            dir.join("invoice-4471.json"),
            br#"{"invoice":4471,"amount":1200}"#,
        )?;
        cp.done.push(1);
        save_checkpoint(&dir, &cp);
        emit(&serde_json::json!({"event": "step_done", "step": 1}));
    }
    // Step 2: send the invoice email.
    if !cp.done.contains(&2) {
        let email = Email {
            invoice_id: INVOICE,
            to: "ap@acme.test".into(),
            body: model_writes_body(INVOICE),
        };
        let req = SendInvoice { email, key: None };
        let accepted = match path {
            Path_::Naive | Path_::Naive503 | Path_::Receipts503 => {
                client.clone().oneshot(req).await?
            }
            Path_::Receipts => {
                emit(
                    &serde_json::json!({"event": "intent", "note": "the receipt layer records the intent before the send"}),
                );
                send_invoice_stack(true, &dir, client.clone())?
                    .oneshot(send_invoice_call(&req.email))
                    .await?
            }
        };
        cp.done.push(2);
        save_checkpoint(&dir, &cp);
        emit(
            &serde_json::json!({"event": "step_done", "step": 2, "message_id": accepted.message_id}),
        );
    }
    // Step 3: mark the order billed.
    if !cp.done.contains(&3) {
        std::fs::write(dir.join("order-billed"), b"yes")?;
        cp.done.push(3);
        save_checkpoint(&dir, &cp);
        emit(&serde_json::json!({"event": "step_done", "step": 3}));
    }
    emit(&serde_json::json!({"event": "run_complete", "success": true}));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The parent: provider, crash, resume, report.

/// What happened on one path.
#[derive(Debug, Serialize)]
pub struct Report {
    pub path: &'static str,
    pub emails_delivered: u32,
    pub run_reported_success: bool,
    pub killed_after_send: bool,
    pub moments: Vec<Moment>,
}

#[derive(Debug, Serialize)]
pub struct Moment {
    pub t_ms: u64,
    pub moment: &'static str,
    pub what: String,
    pub state: String,
}

fn receipt_row(dir: &Path) -> String {
    let db = dir.join("receipts.db");
    if !db.exists() {
        return "no receipt store".into();
    }
    match rusqlite::Connection::open(&db).and_then(|c| {
        c.query_row(
            "SELECT key, receipt IS NOT NULL, length(receipt) FROM stormguard_receipts",
            [],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, bool>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                ))
            },
        )
    }) {
        Ok((key, true, _)) => format!("key {key}: receipt recorded"),
        Ok((key, false, _)) => format!("key {key}: intent pending, no receipt"),
        Err(_) => "no record".into(),
    }
}

/// Runs one path: the child until the kill, then the resume. `child_command` builds the command
/// that starts the child (`--child` arguments are appended by the caller's closure).
pub async fn run_path(
    path: Path_,
    provider: &mut Provider,
    started: Instant,
    child_command: &dyn Fn(Path_, SocketAddr, &Path, bool) -> Command,
) -> Report {
    let dir = std::env::temp_dir().join(format!(
        "stormguard-invoice-{}-{}-{}",
        path.name(),
        std::process::id(),
        started.elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let before = provider.deliveries();
    let ms = |d: Duration| d.as_millis() as u64;
    let mut moments = Vec::new();

    // First run, with the crash window open.
    let mut first = child_command(path, provider.addr, &dir, true)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the run");
    let stdout = first.stdout.take().expect("stdout");
    let lines = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    if path == Path_::Receipts {
        moments.push(Moment {
            t_ms: ms(started.elapsed()),
            moment: "before the send",
            what: format!("the receipt layer writes the intent row for run {RUN}, step 2"),
            state: "intent recorded".into(),
        });
    }
    // Kill it as soon as the provider has accepted the send.
    let sent = tokio::time::timeout(Duration::from_secs(30), provider.events.recv())
        .await
        .ok()
        .flatten();
    let killed = sent.is_some();
    if let Some(ev) = &sent {
        moments.push(Moment {
            t_ms: ms(ev.at),
            moment: "the send",
            what: format!(
                "the provider accepts the email (key: {}), delivers {}",
                ev.key.as_deref().unwrap_or("none"),
                ev.message_id
            ),
            state: if ev.key.is_some() {
                "provider stores the result under the key".into()
            } else {
                "provider keeps nothing".into()
            },
        });
    }
    first.kill().expect("SIGKILL the run");
    let _ = first.wait();
    let _ = lines.join();
    moments.push(Moment {
        t_ms: ms(started.elapsed()),
        moment: "crash",
        what: "SIGKILL: the process dies before its receipt or checkpoint for step 2".into(),
        state: match path {
            Path_::Naive | Path_::Naive503 => "checkpoint says step 1 done, step 2 not".into(),
            Path_::Receipts | Path_::Receipts503 => receipt_row(&dir),
        },
    });

    // Resume.
    let resume_at = started.elapsed();
    let resumed = child_command(path, provider.addr, &dir, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .expect("resume the run");
    let out = String::from_utf8_lossy(&resumed.stdout).to_string();
    let success = out.lines().any(|l| l.contains("\"run_complete\"")) && resumed.status.success();
    let mut resent = Vec::new();
    while let Ok(ev) = provider.events.try_recv() {
        resent.push(ev);
    }
    moments.push(Moment {
        t_ms: ms(resume_at),
        moment: "resume, step 2",
        what: match (path, resent.first()) {
            (Path_::Naive, Some(ev)) => format!("the checkpoint says step 2 is pending: the model rewrites the email and sends it again; the provider delivers {}", ev.message_id),
            (Path_::Receipts, Some(ev)) if !ev.delivered => format!("the intent is pending without a receipt: sent again with the same key; the provider returns the stored {}", ev.message_id),
            (_, Some(ev)) => format!("sent again; delivered {}", ev.message_id),
            (_, None) => "nothing sent".into(),
        },
        state: match path {
            Path_::Naive | Path_::Naive503 => "a second email".into(),
            Path_::Receipts | Path_::Receipts503 => "no second email".into(),
        },
    });
    moments.push(Moment {
        t_ms: ms(started.elapsed()),
        moment: "after",
        what: format!(
            "the run reports {}",
            if success { "success" } else { "failure" }
        ),
        state: match path {
            Path_::Naive | Path_::Naive503 => {
                "the checkpoint is the only record; it cannot say whether the email went out".into()
            }
            Path_::Receipts | Path_::Receipts503 => {
                format!("{} (the system of record)", receipt_row(&dir))
            }
        },
    });
    let _ = std::fs::remove_dir_all(&dir);
    Report {
        path: path.name(),
        emails_delivered: provider.deliveries() - before,
        run_reported_success: success,
        killed_after_send: killed,
        moments,
    }
}

// ---------------------------------------------------------------------------------------------
// The 503 paths: no crash; the provider did the work and a proxy answered 503.

/// Sends the invoice email once through `path`'s stack, in this process, against a provider
/// that takes no key behind a proxy that answers the first send with 503 after forwarding it.
pub async fn run_503_path(path: Path_, provider: &mut Provider, started: Instant) -> Report {
    let dir = std::env::temp_dir().join(format!(
        "stormguard-invoice-{}-{}-{}",
        path.name(),
        std::process::id(),
        started.elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    provider.unkeyed_behind_a_resetting_proxy();
    let before = provider.deliveries();
    let ms = |d: Duration| d.as_millis() as u64;
    let client = EmailClient {
        client: Client::builder(TokioExecutor::new()).build_http(),
        provider: provider.addr,
        crash_window: Duration::ZERO,
        report: false,
    };
    let email = Email {
        invoice_id: INVOICE,
        to: "ap@acme.test".into(),
        body: model_writes_body(INVOICE),
    };
    let req = SendInvoice { email, key: None };
    let result: Result<Accepted, BoxError> = match path {
        Path_::Naive503 => {
            // What a generic retry middleware does by default: 503 is "transient", retry it.
            let mut last = Err::<Accepted, BoxError>("not sent".into());
            for _ in 0..3 {
                last = client.clone().oneshot(req.clone()).await;
                if last.is_ok() {
                    break;
                }
            }
            last
        }
        _ => match send_invoice_stack(false, &dir, client) {
            Ok(stack) => stack
                .oneshot(send_invoice_call(&req.email))
                .await
                .map_err(Into::into),
            Err(e) => Err(e),
        },
    };
    let mut sends = Vec::new();
    while let Ok(ev) = provider.events.try_recv() {
        sends.push(ev);
    }
    let mut moments = Vec::new();
    for (i, ev) in sends.iter().enumerate() {
        moments.push(Moment {
            t_ms: ms(ev.at),
            moment: if i == 0 { "the send" } else { "a retry" },
            what: format!("the provider delivers {}", ev.message_id),
            state: if i == 0 {
                "the proxy loses the upstream and answers 503".into()
            } else {
                "a second email".into()
            },
        });
    }
    let success = result.is_ok();
    moments.push(Moment {
        t_ms: ms(started.elapsed()),
        moment: "after",
        what: match &result {
            Ok(a) => format!("the run reports success ({})", a.message_id),
            Err(e) => format!("the run reports failure: {e}"),
        },
        state: match path {
            Path_::Naive503 => "the 503 was read as 'nothing happened'".into(),
            _ => format!(
                "{}; a person checks the provider and settles it (ReceiptStore::resolve)",
                receipt_row(&dir)
            ),
        },
    });
    let _ = std::fs::remove_dir_all(&dir);
    Report {
        path: path.name(),
        emails_delivered: provider.deliveries() - before,
        run_reported_success: success,
        killed_after_send: false,
        moments,
    }
}
