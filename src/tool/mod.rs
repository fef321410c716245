//! The tool table: each tool declared once, as data ([`Tool`]), the tools of one agent with their
//! named shared parts ([`Toolbox`]), and its audit ([`Toolbox::audit`]).
//!
//! ```
//! use stormguard::class::ToolClass;
//! use stormguard::tool::{KeyPart, RetryOwner, Tool, Toolbox, UnknownOutcome};
//!
//! let send = Tool::new("send_invoice", ToolClass::KeyedWrite, RetryOwner::Layer)
//!     .key(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("invoice_id")])
//!     .unknown_outcome(UnknownOutcome::Escalate);
//! let toolbox = Toolbox::new(vec![send]).unwrap();
//! assert!(toolbox.audit().findings.is_empty());
//! ```

mod above;
mod audit;
mod boxed;
mod build;
mod call;
mod either;
mod held;
mod key_watch;
mod listed;
#[cfg(feature = "rmcp")]
mod mcp;
mod parts;
mod read_back;
mod rebuilds;
mod router;
mod scan;
mod service;
mod spec;
mod spec_key;
mod stack;
mod toolbox;
mod tools;

pub use audit::{Audit, Finding, Row, Severity};
pub use build::Stores;
pub use call::Call;
pub use held::{HeldCall, HeldResolution};
pub use listed::ListedTool;
#[cfg(feature = "rmcp")]
pub use mcp::McpPeer;
pub use parts::{
    Annotations, BackoffSpec, KeyPart, QuotaUse, ReceiptUse, RetryOwner, UnknownOutcome,
};
pub use router::ToolRouter;
pub use scan::{scan, ScanHit};
pub use service::{ToolFuture, ToolService};
pub use spec::{Tool, DEFAULT_DEADLINE_SECS};
pub use stack::ToolLayer;
pub use toolbox::{BreakerSpec, BudgetSpec, HedgeSpec, QuotaSpec, SpecError, StoreSpec, Toolbox};
pub use tools::Tools;
