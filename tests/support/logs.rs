//! Runs a test's closure under a tracing subscriber of its own and returns the WARN (and
//! ERROR) lines it wrote.
#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` on this thread with a subscriber that keeps WARN and ERROR events (a
/// current-thread runtime inside `f` logs here too), and returns its output with those lines.
pub fn warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    (out, text.lines().map(str::to_owned).collect())
}
