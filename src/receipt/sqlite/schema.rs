//! The table, the columns later versions added (and their migration), and how a row is read
//! into a [`Record`].

use super::err;
use crate::receipt::store::{Record, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS stormguard_receipts (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    owner TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    receipt BLOB,
    done_ms INTEGER,
    taken_ms INTEGER,
    sent_ms INTEGER,
    lands_by_ms INTEGER
);
CREATE INDEX IF NOT EXISTS stormguard_receipts_since ON stormguard_receipts (since_ms);
";

/// Columns added after the first release: a file written by an earlier version gets them when it
/// is opened (NULL in its old rows, read as "unknown").
const ADDED: [&str; 3] = ["taken_ms", "sent_ms", "lands_by_ms"];

/// Adds the columns an older file lacks, in one write transaction (two processes opening one old
/// file add them once).
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let missing = |conn: &Connection| -> rusqlite::Result<Vec<&'static str>> {
        let mut st = conn.prepare("SELECT name FROM pragma_table_info('stormguard_receipts')")?;
        let have = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(ADDED
            .into_iter()
            .filter(|c| !have.iter().any(|h| h == c))
            .collect())
    };
    if missing(conn)?.is_empty() {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let added = missing(conn).and_then(|columns| {
        columns.iter().try_for_each(|c| {
            conn.execute_batch(&format!(
                "ALTER TABLE stormguard_receipts ADD COLUMN {c} INTEGER"
            ))
        })
    });
    match added {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The columns a [`Record`] is read from, in the order [`row_record`] reads them.
pub(super) const RECORD_COLUMNS: &str =
    "fingerprint, owner, since_ms, lease_until_ms, receipt, COALESCE(taken_ms, since_ms), sent_ms, COALESCE(lands_by_ms, 0)";

/// A row of [`RECORD_COLUMNS`], owned.
pub(super) type Row = (
    String,
    String,
    i64,
    i64,
    Option<Vec<u8>>,
    i64,
    Option<i64>,
    i64,
);

pub(super) fn read_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Row> {
    Ok((
        r.get(at)?,
        r.get(at + 1)?,
        r.get(at + 2)?,
        r.get(at + 3)?,
        r.get(at + 4)?,
        r.get(at + 5)?,
        r.get(at + 6)?,
        r.get(at + 7)?,
    ))
}

pub(super) fn row_record(row: &Row) -> Record<'_> {
    let (fp, owner, since, lease_until, receipt, taken, sent, lands_by) = row;
    Record {
        fingerprint: fp,
        owner,
        since_ms: *since as u64,
        lease_until_ms: *lease_until as u64,
        receipt: receipt.as_deref(),
        taken_ms: *taken as u64,
        sent_ms: sent.map(|s| s as u64),
        lands_by_ms: *lands_by as u64,
    }
}

/// The record of `key`, if there is one.
pub(super) fn read_record(conn: &Connection, key: &str) -> Result<Option<Row>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM stormguard_receipts WHERE key = ?1"
    ))
    .and_then(|mut st| st.query_row(params![key], |r| read_row(r, 0)).optional())
    .map_err(err("read the record"))
}
