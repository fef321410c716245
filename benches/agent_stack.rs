//! The whole agent stack per operation, side by side with the bare client: a first-try keyed
//! write through three nested `Retry` layers, a `ReceiptGuardLayer` on an `InMemoryStore`, a closed
//! breaker and a quota with room, over an HTTP client that answers at once.
//!
//! `cargo bench --bench agent_stack`. Before the timings it prints the allocations per
//! operation of each stack (counted by a global allocator over 1,000 operations), so CPU time
//! and allocations come from one run. Every operation is a new action (its own key), so the
//! receipt layer records an intent and a receipt each time, as a real write would.

use criterion::{criterion_group, criterion_main, Criterion};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::HttpClassifier;
use stormguard::error::BoxError;
use stormguard::key::Action;
use stormguard::quota::{QuotaLayer, Rate};
use stormguard::receipt::{Codec, InMemoryStore, ReceiptGuardLayer};
use stormguard::retry::{HttpReplay, RetryLayer};
use tower::{service_fn, ServiceBuilder, ServiceExt};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Stores the response's status and body (the bench defines its own, so it builds against any
/// version of the crate).
#[derive(Clone, Copy)]
struct StatusAndBody;

impl Codec<http::Response<String>> for StatusAndBody {
    fn encode(&self, res: &http::Response<String>) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(&(res.status().as_u16(), res.body()))?)
    }
    fn decode(&self, bytes: &[u8]) -> Result<http::Response<String>, BoxError> {
        let (status, body): (u16, String) = serde_json::from_slice(bytes)?;
        Ok(http::Response::builder().status(status).body(body)?)
    }
}

type Client =
    tower::util::BoxCloneSyncService<http::Request<String>, http::Response<String>, BoxError>;

fn client() -> Client {
    Client::new(service_fn(|_req: http::Request<String>| async {
        Ok::<_, BoxError>(http::Response::new("sent".to_string()))
    }))
}

fn charge(n: u64) -> http::Request<String> {
    http::Request::post(format!("/charges/{n}"))
        .body("{\"amount\":100}".to_string())
        .unwrap()
}

/// The agent stack over `client`.
fn agent_stack(client: Client) -> Client {
    let budget = RetryBudget::default();
    let retry = |class, name: &'static str| {
        RetryLayer::new(class, budget.clone())
            .name(name)
            .classifier(HttpClassifier)
            .replay(HttpReplay)
    };
    let action =
        |req: &http::Request<String>| Action::new("run-1", "step-2", "charge", &req.uri().path());
    let rate = Rate::per_second(1_000_000).burst(100_000).build().unwrap();
    let stack = ServiceBuilder::new()
        .layer(retry(ToolClass::KeyedWrite, "agent-loop"))
        .layer(retry(ToolClass::KeyedWrite, "tool-wrapper"))
        .map_err(BoxError::from)
        .layer(
            ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, action)
                .classifier(HttpClassifier)
                .codec(StatusAndBody),
        )
        .layer(
            CircuitBreakerLayer::new(Breaker::new("billing", BreakerConfig::default()))
                .classifier(HttpClassifier),
        )
        .map_err(BoxError::from)
        .layer(retry(ToolClass::Read, "client"))
        .map_err(BoxError::from)
        .layer(QuotaLayer::new(rate))
        .map_err(BoxError::from)
        .service(client);
    Client::new(stack.map_err(BoxError::from))
}

static NEXT: AtomicU64 = AtomicU64::new(0);

async fn one(stack: &Client) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let resp = stack.clone().oneshot(charge(n)).await.unwrap();
    assert_eq!(resp.status(), 200);
}

fn allocations_per_operation(rt: &tokio::runtime::Runtime, stack: &Client) -> f64 {
    rt.block_on(async {
        for _ in 0..100 {
            one(stack).await;
        }
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..1_000 {
            one(stack).await;
        }
        (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 1_000.0
    })
}

fn agent(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bare = client();
    let stack = rt.block_on(async { agent_stack(client()) });
    // The fault layer switched off right above the client, where a test turns it on.
    #[cfg(feature = "chaos")]
    let chaos_off = rt.block_on(async {
        use tower::Layer;
        agent_stack(Client::new(
            stormguard::chaos::ChaosLayer::off().layer(client()),
        ))
    });
    for (name, svc) in [("bare_client", &bare), ("agent_stack", &stack)] {
        println!(
            "allocations per operation, {name}: {:.1}",
            allocations_per_operation(&rt, svc)
        );
    }
    let mut group = c.benchmark_group("agent");
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("bare_client", |b| b.to_async(&rt).iter(|| one(&bare)));
    group.bench_function("agent_stack_keyed_write", |b| {
        b.to_async(&rt).iter(|| one(&stack))
    });
    #[cfg(feature = "chaos")]
    group.bench_function("agent_stack_keyed_write_chaos_off", |b| {
        b.to_async(&rt).iter(|| one(&chaos_off))
    });
    group.finish();
}

criterion_group!(benches, agent);
criterion_main!(benches);
