//! The pictures (placeholder until plotters is wired in).
use super::sim::{Policy, Stats};

pub fn rates(_dir: &std::path::Path, _rows: &[(Policy, Stats)]) -> std::io::Result<()> {
    Err(std::io::Error::other("not yet"))
}
