//! The harness's settings checked before any episode runs, and what they decide between
//! episodes: how a crashed run resumes, and how long after the crash.

use super::episodes::{Harness, Report};
use super::provider::unit;
use super::script::Resume;
use crate::receipt::NoReadBack;
use crate::tool::{SpecError, Stores, UnknownOutcome};
use std::time::Duration;

impl Harness {
    /// The checks [`run`](Self::run) makes first: something to run, the rates, the resumes,
    /// and every step's tool declared and its stack built.
    pub(super) fn check(&self, episodes: u32) -> Result<(), SpecError> {
        let refuse = |field: &str, reason: &str| Err(SpecError::new(None, field, reason));
        if episodes == 0 {
            return refuse("episodes", "run at least one episode");
        }
        if self.script.is_empty() {
            return refuse("script", "give the agent at least one step");
        }
        for (field, p) in [
            ("before_work", self.before_work),
            ("rate_limited", self.rate_limited),
            ("after_work", self.after_work),
            ("late_commits", self.late),
            ("crashes", self.crash),
            ("rewords", self.rewords),
            ("parallel", self.parallel),
            ("reissues_escalations", self.defiant),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return refuse(field, "must be within 0.0..=1.0");
            }
        }
        let sum = self.before_work + self.rate_limited + self.after_work + self.late;
        if sum > 1.0 {
            return refuse(
                "fault_rates",
                &format!(
                    "before_work ({}) + rate_limited ({}) + after_work ({}) + late_commits ({}) = {sum}: a call's fault rates must add up to at most 1.0",
                    self.before_work, self.rate_limited, self.after_work, self.late
                ),
            );
        }
        if self.reissues > MAX_REISSUES {
            return refuse(
                "reissues",
                &format!("at most {MAX_REISSUES}: a model that reissues a failing call without end never ends its episode"),
            );
        }
        if self.resumes.is_empty() {
            return refuse("resumes", "name at least one way to resume");
        }
        let declared = |tool: &str| self.toolbox.tools().iter().any(|t| t.name == tool);
        let missing = |field: &str, tool: &str| {
            Err(SpecError::new(
                Some(tool),
                field,
                "the toolbox holds no such tool",
            ))
        };
        if let Some(tool) = self.applies.keys().find(|tool| !declared(tool)) {
            return missing("applies", tool);
        }
        if let Some(step) = self.script.iter().find(|s| !declared(&s.tool)) {
            return missing("script", &step.tool);
        }
        // Every step's stack is built once here, as each episode builds it: a stack the
        // toolbox cannot build is refused now, not counted as escalations.
        let tools = self.toolbox.with_stores_in_memory().build(Stores::new())?;
        for step in &self.script {
            if self.reads_back(&step.tool) {
                tools.layer_reading_back(&step.tool, NoReadBack)?;
            } else {
                tools.layer(&step.tool)?;
            }
        }
        Ok(())
    }

    /// Refuses a run in which some step's tool never reached the provider: its report could
    /// not fail (a key field the arguments lack, a quota key the call does not carry).
    pub(super) fn reached(&self, report: &Report) -> Result<(), SpecError> {
        let Some(step) = self
            .script
            .iter()
            .find(|s| !report.calls_by_tool.contains_key(&s.tool))
        else {
            return Ok(());
        };
        let ended: Vec<String> = report
            .escalations
            .iter()
            .map(|(code, n)| format!("{n} x {code}"))
            .collect();
        Err(SpecError::new(
            Some(&step.tool),
            "script",
            &format!(
                "no call of this tool reached the provider in {} episodes (steps ended: {}): a step that never reaches it tests nothing. Do its arguments hold every field its key names, and does the call carry what its quota is keyed on?",
                report.episodes,
                if ended.is_empty() { String::from("none") } else { ended.join(", ") }
            ),
        ))
    }

    /// Whether `tool` declares a read-back for an unknown outcome.
    pub(super) fn reads_back(&self, tool: &str) -> bool {
        self.toolbox.tools().iter().any(|t| {
            t.name == tool && matches!(t.unknown_outcome, Some(UnknownOutcome::ReadBack { .. }))
        })
    }

    /// How the run of the episode seeded `eseed` resumes after its `crash`-th crash (drawn
    /// among [`resumes`](Self::resumes)), counted in `report`.
    pub(super) fn resume(&self, eseed: u64, crash: u64, report: &mut Report) -> Resume {
        let i = (unit(eseed, 10 + crash) * self.resumes.len() as f64) as usize;
        let resume = self.resumes[i.min(self.resumes.len() - 1)];
        *report
            .faults
            .entry(resume_name(resume).to_owned())
            .or_default() += 1;
        resume
    }

    /// How long after a crash the resumed process starts.
    pub(super) fn resume_after(&self, resume: Resume) -> Duration {
        let receipts = self
            .toolbox
            .tools()
            .iter()
            .filter_map(|t| t.receipt.as_ref());
        let lease = receipts
            .clone()
            .map(|r| r.lease_secs.unwrap_or(DEFAULT_LEASE_SECS))
            .max()
            .unwrap_or(DEFAULT_LEASE_SECS);
        let window = receipts
            .filter_map(|r| r.provider_key_window_secs)
            .chain(std::iter::once(86_400))
            .max()
            .unwrap_or(86_400);
        Duration::from_secs(match resume {
            Resume::AtOnce => 1,
            Resume::AfterLease => lease + 1,
            Resume::AfterKeyWindow => window + lease + 1,
        })
    }
}

/// The receipt lease a tool gets when it names none (the receipt layer's default).
const DEFAULT_LEASE_SECS: u64 = 30;

fn resume_name(resume: Resume) -> &'static str {
    match resume {
        Resume::AtOnce => "resume_at_once",
        Resume::AfterLease => "resume_after_lease",
        Resume::AfterKeyWindow => "resume_after_key_window",
    }
}

/// The most reissues a harness models (a model gives up long before).
pub(super) const MAX_REISSUES: u32 = 100;
