//! A saga against a real provider: reserve -> charge -> issue, with release and refund, run
//! cleanly, with the issue failing for good, with a SIGKILL after the charge and a resume, and
//! with an unknown outcome of the charge settled by an operator.
//!
//! ```text
//! cargo run --release --all-features --example saga -- --json
//! ```
//!
//! The provider (an HTTP server on 127.0.0.1) counts each action once per idempotency key and
//! prints nothing; each run prints one JSON line with the counts per action. The example exits 1
//! if any action was counted twice or a run did not end as it should.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::classify::OkIsSuccess;
use stormguard::error::BoxError;
use stormguard::receipt::{Durability, ReceiptStore, Resolution, SqliteStore};
use stormguard::saga::{Halt, Saga, SagaSpec};
use stormguard::tool::{Call, Stores, Toolbox};

/// The trip's tools; `charge` is a keyed write, or an unkeyed one at a provider without keys.
fn toolbox(charge_class: &str) -> Toolbox {
    let tool = |name: &str, class: &str| {
        json!({
            "name": name, "class": class, "retry": ["layer"], "key": ["run", "tool"],
            "unknown_outcome": "escalate",
            "receipt": { "store": "receipts", "provider_key_window_secs": 86400, "lease_secs": 1 }
        })
    };
    let tools = [
        tool("reserve", "keyed_write"),
        tool("release", "keyed_write"),
        tool("charge", charge_class),
        tool("refund", "keyed_write"),
        tool("issue", "keyed_write"),
    ];
    let file = json!({
        "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
        "tools": tools
    });
    Toolbox::from_json_str(&file.to_string())
        .and_then(|tb| tb.with_saga("trip", spec()))
        .expect("a valid tool table")
}

fn spec() -> SagaSpec {
    SagaSpec::new()
        .step("reserve", Some("release"))
        .step("charge", Some("refund"))
        .step("issue", None)
}

/// The saga over the provider at `addr`, its receipts in the SQLite file `db`.
fn saga(addr: SocketAddr, db: &Path, charge_class: &str) -> Result<Saga, BoxError> {
    let store = SqliteStore::open(db, Durability::PowerLoss)?;
    let tools = toolbox(charge_class).build(Stores::new().with("receipts", store))?;
    let client = reqwest::Client::builder()
        .retry(reqwest::retry::never())
        .build()?;
    let body = tower::service_fn(move |call: Call| {
        let request = client
            .post(format!("http://{addr}/{}", call.tool().unwrap_or_default()))
            .header("idempotency-key", call.key().map_or("", |k| k.as_str()))
            .body(call.args().to_string());
        async move {
            let response = request.send().await?.error_for_status()?;
            Ok::<Value, BoxError>(serde_json::from_str(&response.text().await?)?)
        }
    });
    Ok(tools
        .saga("trip", body, OkIsSuccess)?
        .lease(Duration::from_secs(1)))
}

/// What the provider does: each action once per key; `fail` answers 422 (for good); `hang` takes
/// the action and never answers (the parent kills the child meanwhile); `reset` takes the action
/// and closes the connection without an answer.
#[derive(Default)]
struct Provider {
    effects: BTreeMap<String, u32>,
    keys: BTreeMap<String, Value>,
    fail: Option<String>,
    hang: Option<String>,
    reset: Option<String>,
}

type Shared = Arc<Mutex<Provider>>;

async fn serve(provider: Shared) -> std::io::Result<SocketAddr> {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let provider = provider.clone();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let provider = provider.clone();
                    async move {
                        let action = req.uri().path().trim_start_matches('/').to_owned();
                        let key = req
                            .headers()
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let _ = req.into_body().collect().await;
                        let (answer, hang, reset) = {
                            let mut p = provider.lock().unwrap();
                            if p.fail.as_deref() == Some(action.as_str()) {
                                let resp = http::Response::builder().status(422);
                                return Ok::<_, BoxError>(
                                    resp.body(Full::<bytes::Bytes>::from("refused"))?,
                                );
                            }
                            let answer = match p.keys.get(&key) {
                                Some(answer) => answer.clone(),
                                None => {
                                    *p.effects.entry(action.clone()).or_default() += 1;
                                    let mut answer = serde_json::Map::new();
                                    answer.insert(action.clone(), json!("done"));
                                    let answer = Value::Object(answer);
                                    p.keys.insert(key, answer.clone());
                                    answer
                                }
                            };
                            let hang = p.hang.as_deref() == Some(action.as_str());
                            let reset = p.reset.as_deref() == Some(action.as_str());
                            (answer, hang, reset)
                        };
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        if reset {
                            // An error of the service: hyper closes the connection, no answer sent.
                            return Err(BoxError::from("reset after the work"));
                        }
                        Ok(http::Response::builder()
                            .body(Full::<bytes::Bytes>::from(answer.to_string()))?)
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, svc));
        }
    });
    Ok(addr)
}

/// The child process: one run of the saga, then exit (or be killed first).
async fn child(addr: SocketAddr, db: PathBuf) -> Result<(), BoxError> {
    let trip = saga(addr, &db, "keyed_write")?;
    let _ = trip.run("trip-c", json!({ "seat": "12A" })).await;
    Ok(())
}

/// Runs the saga until it completes or halts for good, as a supervisor would: a paused run or one
/// held by a dead runner is tried again once its lease has passed.
async fn supervise(trip: &Saga, run: &str) -> Result<Vec<Value>, Halt> {
    for _ in 0..30 {
        match trip.run(run, json!({ "seat": "12A" })).await {
            Ok(answers) => return Ok(answers),
            Err(e) if matches!(e.halt(), Halt::Paused { .. } | Halt::InProgress) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(e.halt().clone()),
        }
    }
    Err(Halt::InProgress)
}

fn ended(end: &Result<Vec<Value>, Halt>) -> String {
    match end {
        Ok(_) => String::from("completed"),
        Err(Halt::Compensated { step }) => format!("compensated after {step}"),
        Err(halt) => format!("{halt:?}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        return child(args[2].parse()?, PathBuf::from(&args[3])).await;
    }
    let dir = std::env::temp_dir().join(format!("stormguard-saga-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut ok = true;
    let mut report = |case: &str, provider: &Shared, end: String, expect: &[(&str, u32)]| {
        let effects = provider.lock().unwrap().effects.clone();
        let expected: BTreeMap<String, u32> =
            expect.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        let met = effects == expected;
        ok &= met;
        let line = json!({ "case": case, "ended": end, "actions": effects, "met": met });
        println!("{line}");
    };

    // (a) Cleanly.
    let provider = Shared::default();
    let addr = serve(provider.clone()).await?;
    let trip = saga(addr, &dir.join("a.db"), "keyed_write")?;
    let end = supervise(&trip, "trip-a").await;
    let again = supervise(&trip, "trip-a").await; // a second run repeats nothing
    let done = [("charge", 1), ("issue", 1), ("reserve", 1)];
    report(
        "clean",
        &provider,
        format!("{} / {}", ended(&end), ended(&again)),
        &done,
    );

    // (b) The issue fails for good: the charge is refunded, the seat released, once each.
    let provider = Shared::default();
    provider.lock().unwrap().fail = Some("issue".into());
    let addr = serve(provider.clone()).await?;
    let trip = saga(addr, &dir.join("b.db"), "keyed_write")?;
    let end = supervise(&trip, "trip-b").await;
    let undone = [("charge", 1), ("refund", 1), ("release", 1), ("reserve", 1)];
    report("issue-fails", &provider, ended(&end), &undone);

    // (c) SIGKILL after the charge was taken, then a resume in this process.
    let provider = Shared::default();
    provider.lock().unwrap().hang = Some("charge".into());
    let addr = serve(provider.clone()).await?;
    let db = dir.join("c.db");
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--child", &addr.to_string()])
        .arg(&db)
        .spawn()?;
    let waited = std::time::Instant::now();
    while !provider.lock().unwrap().effects.contains_key("charge") {
        if waited.elapsed() > Duration::from_secs(30) {
            child.kill()?;
            return Err("the child never reached the charge".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill()?; // SIGKILL: the charge is done, its answer and receipt never came
    child.wait()?;
    provider.lock().unwrap().hang = None;
    let trip = saga(addr, &db, "keyed_write")?;
    let end = supervise(&trip, "trip-c").await;
    report("sigkill-after-charge", &provider, ended(&end), &done);

    // (d) The charge at a provider without keys is reset after it took the money: unknown, the
    // saga halts; the operator checks with the provider, settles it as done; the saga resumes.
    let provider = Shared::default();
    provider.lock().unwrap().reset = Some("charge".into());
    let addr = serve(provider.clone()).await?;
    let db = dir.join("d.db");
    let trip = saga(addr, &db, "unkeyed_write")?;
    let halted = supervise(&trip, "trip-d").await;
    provider.lock().unwrap().reset = None;
    let store = SqliteStore::open(&db, Durability::PowerLoss)?;
    for intent in store.pending(10).await? {
        if intent.key.contains(":charge:") {
            let receipt = br#"{"charge":"done"}"#.to_vec();
            store
                .resolve(&intent.key, Resolution::Done(receipt))
                .await?;
        }
    }
    let end = supervise(&trip, "trip-d").await;
    let ends = format!("{} / settled: {}", ended(&halted), ended(&end));
    report("unknown-outcome-settled", &provider, ends, &done);

    let _ = std::fs::remove_dir_all(&dir);
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
