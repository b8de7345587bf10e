//! Runs: creation and lookup, always inside a tenant-scoped transaction.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use ulid::Ulid;

use super::db::{tenant_tx, Db};
use crate::error::{Error, ErrorCode, Result};
use agent_stream_core::domain::RunState;

/// A run's row: identity, hierarchy, position and state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunInfo {
    /// The run id (ULID).
    pub run_id: String,
    /// The parent for sub-runs.
    pub parent_run_id: Option<String>,
    /// The top of the run tree (itself for top-level runs).
    pub root_run_id: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Time of the last append.
    pub updated_at: DateTime<Utc>,
    /// Seq of the newest event (0 when empty).
    pub last_seq: i64,
    /// Current lifecycle state (`None` before the first `run.lifecycle`).
    pub state: Option<RunState>,
}

/// A run's columns as [`run_from_row`] reads them, from [`RUNS`]: its head (last seq,
/// and the time of the last append) is the log's last row, not a copy in the run's row
/// (which appends would then have to update on every commit; migration 0009).
const RUN_COLUMNS: &str =
    "r.run_id, r.parent_run_id, r.root_run_id, r.created_at, coalesce(h.ts, r.created_at), coalesce(h.seq, 0), r.state";

/// The runs of tenant `$1`, each with its last event as `h`.
const RUNS: &str = concat!("runs r ", crate::rows::last_event_join!());

fn run_from_row(r: &Row) -> RunInfo {
    RunInfo {
        run_id: r.get(0),
        parent_run_id: r.get(1),
        root_run_id: r.get(2),
        created_at: r.get(3),
        updated_at: r.get(4),
        last_seq: r.get(5),
        state: r.get::<_, Option<&str>>(6).and_then(RunState::parse),
    }
}

/// The error for a run that does not exist *for this tenant*. Other tenants' runs get
/// exactly the same answer, so it never confirms that an id exists elsewhere.
pub fn run_not_found(run_id: &str) -> Error {
    Error::reject(ErrorCode::RunNotFound, format!("run `{run_id}` not found"))
}

/// Checks that a path or body id is a ULID before any query runs: its canonical form,
/// borrowed when it is already in it.
pub fn parse_run_id(s: &str) -> Result<Cow<'_, str>> {
    // Every append parses its run's id, mostly in the form this service wrote it: that
    // form is its own canonical form, so it is checked and borrowed instead of decoded and
    // encoded again (~600 instructions an append; docs/benchmarks-log.md, 2026-12-01 21:00).
    if is_canonical_ulid(s) {
        return Ok(Cow::Borrowed(s));
    }
    Ulid::from_string(s).map(|u| Cow::Owned(u.to_string())).map_err(|_| {
        Error::reject(
            ErrorCode::InvalidParameter,
            format!("`{}` is not a run id (a 26-character ULID)", truncate(s)),
        )
    })
}

/// True when `s` is a ULID exactly as [`Ulid::to_string`] writes one: 26 characters of
/// Crockford's upper-case alphabet, the first at most `7` (128 bits).
fn is_canonical_ulid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 26 && (b'0'..=b'7').contains(&b[0]) && b.iter().all(|&c| CROCKFORD_UPPER[c as usize])
}

/// Which bytes are digits of Crockford's upper-case alphabet, by table: an append checks
/// its run's id two or three times, and the two ranges and four exclusions per
/// character cost ~300 instructions a check (~1% of a streamed line's).
static CROCKFORD_UPPER: [bool; 256] = {
    let mut t = [false; 256];
    let digits = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut i = 0;
    while i < digits.len() {
        t[digits[i] as usize] = true;
        i += 1;
    }
    t
};

fn truncate(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_owned()
    }
}

/// Creates a run, optionally under `parent_run_id` (which must belong to the tenant).
pub async fn create_run(db: &Db, tenant: &str, parent_run_id: Option<&str>) -> Result<RunInfo> {
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    let run = insert_run(&tx, tenant, parent_run_id).await?;
    tx.commit().await?;
    Ok(run)
}

/// [`create_run`] inside a transaction already scoped to the tenant.
pub async fn insert_run(
    tx: &deadpool_postgres::Transaction<'_>,
    tenant: &str,
    parent_run_id: Option<&str>,
) -> Result<RunInfo> {
    let parent = parent_run_id.map(parse_run_id).transpose()?;
    let root = match &parent {
        Some(p) => {
            let row = tx
                .query_opt("SELECT root_run_id FROM runs WHERE tenant_id = $1 AND run_id = $2", &[&tenant, p])
                .await?;
            match row {
                Some(r) => Some(r.get::<_, String>(0)),
                None => return Err(run_not_found(p)),
            }
        }
        None => None,
    };
    let run_id = next_run_id().to_string();
    let root = root.unwrap_or_else(|| run_id.clone());
    let row = tx
        .query_one(
            // A new run has no events: its head is seq 0, its last change its creation.
            "INSERT INTO runs (tenant_id, run_id, parent_run_id, root_run_id) VALUES ($1, $2, $3, $4)
             RETURNING run_id, parent_run_id, root_run_id, created_at, created_at, 0::bigint, state",
            &[&tenant, &run_id, &parent, &root],
        )
        .await?;
    Ok(run_from_row(&row))
}

/// Looks a run up; `RUN-NOT-FOUND` when the tenant has no such run.
pub async fn get_run(db: &Db, tenant: &str, run_id: &str) -> Result<RunInfo> {
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    let run = get_run_in(&tx, tenant, run_id).await?;
    tx.commit().await?;
    Ok(run)
}

/// [`get_run`] inside a transaction already scoped to the tenant.
pub async fn get_run_in<C: deadpool_postgres::GenericClient>(
    c: &C,
    tenant: &str,
    run_id: &str,
) -> Result<RunInfo> {
    let run_id = parse_run_id(run_id)?;
    let stmt = c
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM {RUNS} WHERE r.tenant_id = $1 AND r.run_id = $2"))
        .await?;
    let row = c.query_opt(&stmt, &[&tenant, &run_id]).await?;
    match row {
        Some(row) => Ok(run_from_row(&row)),
        None => Err(missing_run(c, tenant, &run_id).await?),
    }
}

/// Why a run has no row: retention deleted it (its tombstone says so:
/// `RUN-EXPIRED`), or it never was this tenant's (`RUN-NOT-FOUND`).
async fn missing_run<C: deadpool_postgres::GenericClient>(
    c: &C,
    tenant: &str,
    run_id: &str,
) -> Result<Error> {
    let stmt = c
        .prepare_cached(
            "SELECT last_seq, deleted_at FROM run_tombstones WHERE tenant_id = $1 AND run_id = $2",
        )
        .await?;
    Ok(match c.query_opt(&stmt, &[&tenant, &run_id]).await? {
        Some(t) => {
            let (last_seq, deleted_at): (i64, chrono::DateTime<chrono::Utc>) = (t.get(0), t.get(1));
            Error::reject(
                ErrorCode::RunExpired,
                format!(
                    "run `{run_id}` ended and was deleted by retention at {} (its log held {last_seq} events): \
                     nothing of it can be read or resumed",
                    deleted_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            )
        }
        None => run_not_found(run_id),
    })
}

/// Filters and cursor of a run listing (newest first, by run id).
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only runs created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only runs older than this run id (the cursor).
    pub before_run_id: Option<String>,
    /// Page size.
    pub limit: i64,
}

/// A page of the tenant's runs, newest first. Run ids are ULIDs, so their order is
/// creation order and they double as a stable cursor.
pub async fn list_runs(db: &Db, tenant: &str, q: &RunQuery) -> Result<Vec<RunInfo>> {
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM {RUNS}
             WHERE r.tenant_id = $1
               AND ($2::text IS NULL OR r.state = $2)
               AND ($3::timestamptz IS NULL OR r.created_at >= $3)
               AND ($4::timestamptz IS NULL OR r.created_at < $4)
               AND ($5::text IS NULL OR r.run_id < $5)
             ORDER BY r.run_id DESC LIMIT $6"
        ))
        .await?;
    let state = q.state.map(|s| s.as_str());
    let rows = tx
        .query(&stmt, &[&tenant, &state, &q.created_after, &q.created_before, &q.before_run_id, &q.limit])
        .await?;
    tx.commit().await?;
    Ok(rows.iter().map(run_from_row).collect())
}

/// The tenant's runs created or whose state changed at or after `since`, oldest change
/// first, and the database's clock (the next `since`).
pub async fn changed_since(
    db: &Db,
    tenant: &str,
    since: DateTime<Utc>,
) -> Result<(Vec<RunInfo>, DateTime<Utc>)> {
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    let rows = tx
        .query(
            &format!(
                "SELECT {RUN_COLUMNS} FROM {RUNS} WHERE r.tenant_id = $1 AND r.state_changed_at >= $2
                 ORDER BY r.state_changed_at, r.run_id"
            ),
            &[&tenant, &since],
        )
        .await?;
    let now: DateTime<Utc> = tx.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
    tx.commit().await?;
    Ok((rows.iter().map(run_from_row).collect(), now))
}

/// The tenant's runs that can still change (not in a terminal state) or whose state
/// changed in the last `recent_secs` seconds, each with the time its state last moved
/// (its creation counts), oldest move first, and the database's clock.
pub async fn open_runs(
    db: &Db,
    tenant: &str,
    recent_secs: f64,
) -> Result<(Vec<(RunInfo, DateTime<Utc>)>, DateTime<Utc>)> {
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    let now: DateTime<Utc> = tx.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
    let rows = tx
        .query(
            &format!(
                "SELECT {RUN_COLUMNS}, r.state_changed_at FROM {RUNS} WHERE r.tenant_id = $1
                   AND (r.state IS NULL OR r.state NOT IN ('done', 'aborted', 'error')
                        OR r.state_changed_at >= clock_timestamp() - make_interval(secs => $2))
                 ORDER BY r.state_changed_at, r.run_id"
            ),
            &[&tenant, &recent_secs],
        )
        .await?;
    tx.commit().await?;
    Ok((rows.iter().map(|r| (run_from_row(r), r.get(7))).collect(), now))
}

/// A new run id, greater than every run id this process made before: runs are listed
/// newest first by id, and two runs made in the same millisecond must list in the order
/// they were made (a plain `Ulid::new()` orders them by its random part).
fn next_run_id() -> Ulid {
    static GENERATOR: std::sync::Mutex<ulid::Generator> = std::sync::Mutex::new(ulid::Generator::new());
    let mut generator = GENERATOR.lock().unwrap_or_else(|p| p.into_inner());
    // Overflow needs 2^80 ids in one millisecond; a fresh id is then as good as any.
    generator.generate().unwrap_or_else(|_| Ulid::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What parsing did before the canonical form was taken as written.
    fn decoded_and_written(s: &str) -> Option<String> {
        Ulid::from_string(s).ok().map(|u| u.to_string())
    }

    #[test]
    fn a_run_id_parses_as_decoding_and_writing_it_would() {
        let mut inputs = vec![];
        for _ in 0..2_000 {
            let written = Ulid::new().to_string();
            assert!(is_canonical_ulid(&written), "{written} is how ulid writes it");
            inputs.push(written.to_ascii_lowercase());
            inputs.push(written);
        }
        inputs.extend(
            [
                "7ZZZZZZZZZZZZZZZZZZZZZZZZZ",
                "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
                "00000000000000000000000000",
                "01ARZ3NDEKTSV4RRFFQ69G5FA",
                "01ARZ3NDEKTSV4RRFFQ69G5FAVX",
                "01ARZ3NDEKTSV4RRFFQ69G5FA!",
                "01ARZ3NDEKTSV4RRFFQ69G5FAI",
                "01ARZ3NDEKTSV4RRFFQ69G5FAL",
                "01ARZ3NDEKTSV4RRFFQ69G5FAO",
                "01ARZ3NDEKTSV4RRFFQ69G5FAU",
                "",
            ]
            .map(str::to_owned),
        );
        for s in &inputs {
            assert_eq!(parse_run_id(s).ok().map(Cow::into_owned), decoded_and_written(s), "{s:?}");
        }
        assert!(parse_run_id("01ARZ3NDEKTSV4RRFFQ69G5FA").is_err(), "25 characters are refused");
        for c in ['I', 'L', 'O', 'U'] {
            assert!(
                !is_canonical_ulid(&format!("01ARZ3NDEKTSV4RRFFQ69G5FA{c}")),
                "{c} is not written by ulid"
            );
        }
    }

    #[test]
    fn the_table_holds_exactly_the_upper_case_digits_ulid_writes() {
        for c in 0..=u8::MAX {
            let digit = matches!(c, b'0'..=b'9' | b'A'..=b'Z') && !matches!(c, b'I' | b'L' | b'O' | b'U');
            assert_eq!(CROCKFORD_UPPER[c as usize], digit, "byte {c}");
        }
    }
}
