//! A `Retry` decides as the class it was given: a bare `ToolClass`, or the class of the
//! `ClassPolicy` it was given (there is no second way that could replace it).
mod support;

use std::sync::atomic::Ordering;
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::HttpClassifier;
use stormguard::error::ErrorCode;
use stormguard::retry::{HttpReplay, RetryLayer};
use support::{call, http_script};
use tower::Layer;

/// A request that shows nothing about its class (a POST would: see `Evidence`).
fn request() -> http::Request<String> {
    http::Request::get("/send").body(String::new()).unwrap()
}

/// An ambiguous failure (a 502) is retried for a read and escalated after one call for an
/// unkeyed write, whichever of the two ways the class was given.
#[tokio::test(start_paused = true)]
async fn the_class_given_is_the_class_used() {
    for class in [ToolClass::Read, ToolClass::UnkeyedWrite] {
        let policy = ClassPolicy::builder(class).max_attempts(4).build().unwrap();
        for (given, attempts) in [(ClassPolicy::from(class), 3), (policy, 4)] {
            let (calls, dep) = http_script(502, &[], 10);
            let mut svc = RetryLayer::new(given, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay)
                .layer(dep);
            assert_eq!(svc.policy().class(), class);
            let err = call(&mut svc, request()).await.unwrap_err();
            match class {
                ToolClass::Read => {
                    assert_eq!(calls.load(Ordering::SeqCst), attempts, "{class:?}");
                    assert_eq!(err.code(), ErrorCode::Unavailable);
                }
                _ => {
                    assert_eq!(calls.load(Ordering::SeqCst), 1, "{class:?}");
                    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
                }
            }
        }
    }
}
