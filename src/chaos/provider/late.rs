//! Late commits: a call's work the provider queued lands after its caller gave up. They are kept
//! with the provider's books, so a process resuming a killed one lands what that one queued.

use super::{Provider, ProviderState, LATE};
use crate::receipt::Clock;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A call whose work the provider queued: it lands at `due_ms`.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct Late {
    step: usize,
    tool: String,
    key: Option<String>,
    args: String,
    /// The call's number at the provider (an unkeyed effect's identity).
    call: u64,
    due_ms: u64,
}

impl Provider {
    /// Waits until every late commit has landed (they land [`LATE`] after their call). In a
    /// process that resumed a killed one, the commits that process queued land first (at once
    /// if they are due).
    pub(in crate::chaos) async fn settle(&self) {
        self.revive();
        while !self.lock().late.is_empty() {
            tokio::time::sleep(LATE / 4).await;
        }
    }

    /// Schedules the late commits a killed process queued and nobody is landing (the books say
    /// so; this process's own are scheduled when queued). Called within the runtime.
    pub(in crate::chaos) fn revive(&self) {
        let mut st = self.lock();
        let orphans: Vec<(u64, u64)> = st
            .late
            .iter()
            .filter(|(id, _)| !st.landing.contains(id))
            .map(|(&id, late)| (id, late.due_ms))
            .collect();
        let now = self.world.clock.now_ms();
        for (id, due) in orphans {
            st.landing.insert(id);
            self.land_at(id, Duration::from_millis(due.saturating_sub(now)));
        }
    }

    /// A late commit of this call, due [`LATE`] from now.
    pub(super) fn late(
        &self,
        st: &ProviderState,
        tool: &str,
        key: &Option<String>,
        args: &str,
    ) -> Late {
        Late {
            step: st.step,
            tool: tool.to_owned(),
            key: key.clone(),
            args: args.to_owned(),
            call: st.calls,
            due_ms: self.world.clock.now_ms() + LATE.as_millis() as u64,
        }
    }

    /// Lands a call's work [`LATE`] from now, whatever became of its caller (or its process).
    pub(super) fn land_later(&self, st: &mut ProviderState, late: Late) {
        let id = st.next_late;
        st.next_late += 1;
        st.late.insert(id, late);
        st.landing.insert(id);
        self.land_at(id, LATE);
    }

    /// Lands late commit `id` after `delay`.
    fn land_at(&self, id: u64, delay: Duration) {
        let provider = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut st = provider.lock();
            st.landing.remove(&id);
            if let Some(l) = st.late.remove(&id) {
                // It landed when it was due, whichever process lands it.
                let at = (l.call, l.due_ms);
                provider.apply(&mut st, l.step, &l.tool, l.key.as_deref(), &l.args, at);
                provider.save(&st);
            }
        });
    }
}
