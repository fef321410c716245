//! A call through a declared tool (`Toolbox` -> `ToolService`), side by side in one run with the
//! same policy stacked by hand: the bare body, tower's `Retry` (with a budget) and `Timeout`,
//! stormguard's layers by hand, and the declared stack. A read, and a keyed write whose receipts
//! go to an `InMemoryStore` (every call a new invoice, so each records an intent and a receipt).
//!
//! `cargo bench --bench tool_stack`. Before the timings it prints the allocations per call of
//! each stack (a counting global allocator over 1,000 calls), so time and allocations come from
//! one run.

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::OkIsSuccess;
use stormguard::error::BoxError;
use stormguard::key::Action;
use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer};
use stormguard::retry::RetryLayer;
use stormguard::tool::{Call, Stores, Toolbox};
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneSyncService;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};

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

type Tool = BoxCloneSyncService<Call, Value, BoxError>;

/// The tool's body: answers at once.
fn body() -> Tool {
    Tool::new(service_fn(|call: Call| async move {
        Ok::<Value, BoxError>(json!({ "ok": call.args()["invoice_id"] }))
    }))
}

/// tower's `Retry` with a budget, retrying errors only.
#[derive(Clone)]
struct Budgeted(Arc<TpsBudget>);

impl tower::retry::Policy<Call, Value, BoxError> for Budgeted {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Call, result: &mut Result<Value, BoxError>) -> Option<Ready<()>> {
        match result {
            Ok(_) => {
                self.0.deposit();
                None
            }
            Err(_) => self.0.withdraw().then(|| ready(())),
        }
    }

    fn clone_request(&mut self, call: &Call) -> Option<Call> {
        Some(call.clone())
    }
}

const DEADLINE: Duration = Duration::from_secs(300);

fn tower_read() -> Tool {
    Tool::new(
        ServiceBuilder::new()
            .retry(Budgeted(Arc::new(TpsBudget::default())))
            .timeout(DEADLINE)
            .service(body()),
    )
}

fn policy(class: ToolClass) -> ClassPolicy {
    ClassPolicy::builder(class)
        .deadline(DEADLINE)
        .build()
        .unwrap()
}

fn by_hand_read() -> Tool {
    let retry = RetryLayer::new(policy(ToolClass::Read), RetryBudget::default())
        .name("search")
        .classifier(OkIsSuccess);
    Tool::new(retry.layer(body()).map_err(BoxError::from))
}

fn by_hand_write() -> Tool {
    let action =
        |call: &Call| Action::new(call.run(), "-", "send_invoice", &call.args()["invoice_id"]);
    let receipts = ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, action)
        .classifier(OkIsSuccess);
    let retry = RetryLayer::new(policy(ToolClass::KeyedWrite), RetryBudget::default())
        .name("send_invoice")
        .classifier(OkIsSuccess);
    Tool::new(retry.layer(receipts.layer(body())).map_err(BoxError::from))
}

fn declared() -> (Tool, Tool) {
    let tools = Toolbox::from_json_str(
        r#"{
        "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
        "tools": [
            { "name": "search", "class": "read", "retry": ["layer"] },
            { "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
              "key": ["run", "tool", "id:invoice_id"],
              "receipt": { "store": "receipts", "provider_key_window_secs": 86400 },
              "unknown_outcome": "escalate" }
        ]
    }"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let read = tools
        .layer("search")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body());
    let write = tools
        .layer("send_invoice")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body());
    (
        Tool::new(read.map_err(BoxError::from)),
        Tool::new(write.map_err(BoxError::from)),
    )
}

static NEXT: AtomicU64 = AtomicU64::new(0);

async fn one(tool: &Tool) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let call = Call::new("run-1", "step-2", json!({ "invoice_id": n }));
    let answer = tool.clone().oneshot(call).await.unwrap();
    assert_eq!(answer["ok"], n);
}

fn allocations_per_call(rt: &tokio::runtime::Runtime, tool: &Tool) -> f64 {
    rt.block_on(async {
        for _ in 0..100 {
            one(tool).await;
        }
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..1_000 {
            one(tool).await;
        }
        (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 1_000.0
    })
}

fn tool_stack(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stacks = rt.block_on(async {
        let (declared_read, declared_write) = declared();
        [
            ("read/bare_body", body()),
            ("read/tower_retry_timeout", tower_read()),
            ("read/stormguard_by_hand", by_hand_read()),
            ("read/declared", declared_read),
            ("keyed_write_memory/stormguard_by_hand", by_hand_write()),
            ("keyed_write_memory/declared", declared_write),
        ]
    });
    for (name, tool) in &stacks {
        println!(
            "allocations per call, {name}: {:.1}",
            allocations_per_call(&rt, tool)
        );
    }
    let mut group = c.benchmark_group("tool_stack");
    group.measurement_time(Duration::from_secs(3));
    for (name, tool) in &stacks {
        group.bench_function(*name, |b| b.to_async(&rt).iter(|| one(tool)));
    }
    group.finish();
}

criterion_group!(benches, tool_stack);
criterion_main!(benches);
