//! Runs a test's future on its own runtime with a metrics recorder of its own, and reads what
//! it counted.
#![allow(dead_code, unreachable_pub)]

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::future::Future;

/// What a run counted.
pub struct Counted(Vec<(String, Vec<String>, u64)>);

impl Counted {
    /// The sum of counter `name` over all its labels.
    pub fn total(&self, name: &str) -> u64 {
        self.0
            .iter()
            .filter(|(n, ..)| n == name)
            .map(|(.., v)| v)
            .sum()
    }

    /// Counter `name`'s series: its labels (`key=value`) and its count.
    pub fn series(&self, name: &str) -> Vec<(Vec<String>, u64)> {
        self.0
            .iter()
            .filter(|(n, ..)| n == name)
            .map(|(_, labels, v)| (labels.clone(), *v))
            .collect()
    }
}

fn read(snapshotter: &Snapshotter) -> Counted {
    Counted(
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) => Some((
                    key.key().name().to_string(),
                    key.key()
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect(),
                    n,
                )),
                _ => None,
            })
            .collect(),
    )
}

/// Runs `future` on a current-thread runtime with a recorder of its own (other tests' metrics
/// do not mix in), and returns its output with what it counted.
pub fn counting<T>(future: impl Future<Output = T>) -> (T, Counted) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = metrics::with_local_recorder(&recorder, || rt.block_on(future));
    (out, read(&snapshotter))
}
