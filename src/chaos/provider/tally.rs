//! The episode's books, added to the run's [`Report`].

use super::Provider;
use crate::chaos::episodes::Report;
use crate::chaos::script::{Applies, Step};

impl Provider {
    /// Adds the episode's books to `report`: effects, duplicates (silent or not), lost work,
    /// escalations by code, calls (by tool) and faults.
    pub(in crate::chaos) fn tally(
        &self,
        script: &[Step],
        outcomes: &[Result<(), String>],
        report: &mut Report,
    ) {
        let st = self.lock();
        for (i, (step, outcome)) in script.iter().zip(outcomes).enumerate() {
            let effects = st.effects.get(&i).copied().unwrap_or(0);
            report.effects += effects;
            let extra = effects.saturating_sub(1);
            if extra > 0 {
                report.duplicate_effects += extra;
                *report
                    .duplicates_by_tool
                    .entry(step.tool.clone())
                    .or_default() += extra;
                if outcome.is_ok() {
                    report.silent_duplicates += extra;
                }
            }
            let write = !matches!(
                self.world.tools.get(&step.tool),
                Some((Applies::Nothing, _)) | None
            );
            match outcome {
                Ok(()) if write && effects == 0 => report.lost_work += 1,
                Ok(()) => {}
                Err(code) => *report.escalations.entry(code.clone()).or_default() += 1,
            }
        }
        if st.effects.values().any(|&n| n > 1) {
            report.episodes_duplicated += 1;
        }
        report.calls += st.calls;
        for (tool, n) in &st.calls_by_tool {
            *report.calls_by_tool.entry(tool.clone()).or_default() += n;
        }
        for (fault, n) in &st.faults {
            *report.faults.entry(fault.clone()).or_default() += n;
        }
    }
}
