//! A toolbox built again in the same process: each build has its own budgets, breakers, quotas
//! and held calls, so a toolbox built per call (or per agent step) retries every outage as if
//! it were new, never trips a breaker and forgets the calls it held. Nothing can share what the
//! user did not keep, so the second build of the same declaration is said out loud, once, and
//! every further one is counted (`stormguard_toolbox_rebuilds_total`).

use super::toolbox::Toolbox;
use crate::telemetry;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, OnceLock};

/// The declarations this process has built, by a hash of their JSON, and how often.
static BUILT: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();

/// The most declarations remembered (past it, a new one is not tracked).
const REMEMBERED: usize = 1024;

/// Notes one build of `toolbox`, and says so when the same declaration was built before.
pub(super) fn note(toolbox: &Toolbox) {
    if toolbox.tools().is_empty() {
        return;
    }
    let Ok(json) = serde_json::to_string(toolbox) else {
        return;
    };
    let mut hasher = DefaultHasher::new();
    json.hash(&mut hasher);
    let builds = {
        let mut built = BUILT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let full = built.len() >= REMEMBERED;
        match built.get_mut(&hasher.finish()) {
            Some(n) => {
                *n = n.saturating_add(1);
                *n
            }
            None if full => 1,
            None => {
                built.insert(hasher.finish(), 1);
                1
            }
        }
    };
    if builds < 2 {
        return;
    }
    telemetry::toolbox_rebuilt();
    if builds == 2 {
        let tools: Vec<&str> = toolbox.tools().iter().map(|t| t.name.as_str()).collect();
        tracing::warn!(
            tools = %tools.join(", "),
            "a toolbox with these tools was built again in this process: each build starts its \
             retry budgets, breakers, quotas and held calls empty, so a toolbox built per call \
             retries every outage as if it were new, never opens a breaker and forgets the \
             calls it held (a reissued unknown outcome is sent again); build it once at startup \
             and clone its Tools (ignore this if each build is meant to stand apart, as a \
             restarted process's does)"
        );
    }
}
