//! A scan of Rust sources for random or clock-derived idempotency keys.

use serde::Serialize;

/// What makes a value that differs on every retry: randomness, and the clock (a timestamp, a
/// time-ordered id).
const RANDOM: [&str; 12] = [
    "Uuid::new_v4",
    "rand::",
    "thread_rng",
    "random()",
    "SystemTime::now",
    "Utc::now",
    "Local::now",
    "OffsetDateTime::now",
    "Uuid::now_v7",
    "Uuid::new_v7",
    "Ulid::new",
    "nanoid!",
];
const KEY: [&str; 4] = [
    "IdempotencyKey",
    "idempotency_key",
    "Idempotency-Key",
    "idempotency-key",
];

/// A line that makes a random or clock-derived value near where an idempotency key is built.
///
/// ```
/// let hits = stormguard::tool::scan(&[("a.rs", "let k = IdempotencyKey::new(Uuid::new_v4());")], 5);
/// assert_eq!((hits[0].path.as_str(), hits[0].line), ("a.rs", 1));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScanHit {
    /// The file.
    pub path: String,
    /// The line, from 1.
    pub line: usize,
    /// The line's text, trimmed.
    pub text: String,
}

/// Flags random generation (`Uuid::new_v4`, `rand::`, `thread_rng`, `random()`) and the clock
/// (`SystemTime::now`, chrono's `Utc::now` and `Local::now`, time's `OffsetDateTime::now_*`,
/// time-ordered ids: `Uuid::now_v7`, `Uuid::new_v7`, `Ulid::new`, `nanoid!`) within `window`
/// lines of an idempotency key (`IdempotencyKey`, `idempotency_key`, `Idempotency-Key`,
/// `idempotency-key`): such a key changes on every retry. A pure function over (path, text)
/// pairs.
///
/// ```
/// use stormguard::tool::scan;
/// let far = "let id = Uuid::new_v4();\n\n\n\n\n\n\nlet k = idempotency_key(&run);";
/// assert!(scan(&[("a.rs", far)], 3).is_empty());
/// assert_eq!(scan(&[("a.rs", far)], 10).len(), 1);
/// // A timestamp is a new key on every retry too.
/// let clock = r#"let key = format!("inv-{}", Utc::now().timestamp_millis());
/// req.header("idempotency-key", key)"#;
/// assert_eq!(scan(&[("b.rs", clock)], 3).len(), 1);
/// ```
pub fn scan(files: &[(&str, &str)], window: usize) -> Vec<ScanHit> {
    let mut hits = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        let keys: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| KEY.iter().any(|k| l.contains(k)))
            .map(|(i, _)| i)
            .collect();
        for (i, l) in lines.iter().enumerate() {
            if RANDOM.iter().any(|r| l.contains(r)) && keys.iter().any(|k| k.abs_diff(i) <= window)
            {
                hits.push(ScanHit {
                    path: (*path).to_owned(),
                    line: i + 1,
                    text: l.trim().to_owned(),
                });
            }
        }
    }
    hits
}
