//! The file's tables and their versions: creating them, migrating a schema-1 file (wall
//! clock) to monotonic time, a schema-2 file to sessions, a schema-3 file to
//! advertised values, a schema-4 file to the queue of candidates, a schema-5 file to
//! membership through sessions and a schema-6 file to change numbers, and starting a new
//! boot (every lease, session and candidacy ends, every token stays).

use std::time::{Duration, SystemTime};

use sqlx::sqlite::SqliteConnection;
use tenure::{Error, Result};

use crate::clock::{HostClock, StoreNow, SystemHostClock};
use crate::database::{execute, store_error};
use crate::BACKEND;

/// The schema version this crate writes and understands. Version 1 kept wall-clock
/// nanoseconds and a high-water mark (`tenure_clock`); version 2 had no sessions;
/// version 3 no advertised values; version 4 no queue of candidates; version 5 no
/// membership through sessions; version 6 no change numbers. Opening an older file
/// migrates it.
pub(crate) const SCHEMA_VERSION: i64 = 7;

/// The tables, created idempotently. Times are nanoseconds of the host's monotonic
/// clock, meaningful only under the boot recorded in `tenure_boot` (one row, written by
/// the first write transaction under each boot). `tenure_boot_history` (created by
/// [`enter_boot`] at the first write under a boot, so a file of an earlier build gains
/// it, holding the boot it recorded, without a schema version of its own) keeps the
/// last [`BOOT_HISTORY`] boot ids the file was written under.
///
/// A term held under a session has its session in `session_id` and ends when the
/// session does; its own `expires_at` keeps the session's expiry when the term was
/// taken, which the session only ever passes, so once the session row is gone (closed,
/// or a new boot) the term reads as ended. `AUTOINCREMENT` keeps session ids from ever
/// being handed out twice, even after the newest one was deleted.
///
/// A term's advertised value is in `value`, written by the statement that starts the
/// term (NULL for none) and cleared by a release; `value_token` is the token of the
/// term that wrote it. Readers show `value` only while that term is the row's (see
/// [`SESSION_OBJECTS`]): a schema-3 tenure still running on a migrated file starts
/// terms without touching either column, and its holder must not be shown the address
/// of the term before it.
///
/// A session's `terms_handed` counts the terms handed to it (see `lease/term.rs`).
///
/// A session's `kept_at` is the store time of its last open or keep-alive; a node's
/// `session_id` names the session whose keep-alives count as its heartbeats (see
/// `registry.rs`; NULL for none).
///
/// `tenure_candidates` is the queue of candidates (see `lease/queue.rs`): one row per
/// `(role, owner)` waiting its turn, its place `seq` (a role's first candidate is 1, a
/// joining one takes the role's largest plus one), its expiry on store time and the
/// value its term will advertise. The primary key is the only index: a role's
/// candidates are few, and picking the oldest sorts them.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_boot (
    id      INTEGER PRIMARY KEY CHECK (id = 0),
    boot_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_leases (
    role       TEXT PRIMARY KEY NOT NULL,
    holder     TEXT,
    token      INTEGER NOT NULL CHECK (token >= 1),
    expires_at INTEGER NOT NULL,
    session_id INTEGER,
    value      TEXT,
    value_token INTEGER,
    changed    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tenure_sessions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    owner      TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    kept_at    INTEGER,
    terms_handed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tenure_nodes (
    node_id        TEXT PRIMARY KEY NOT NULL,
    last_heartbeat INTEGER NOT NULL,
    first_seen     INTEGER NOT NULL,
    metadata       TEXT NOT NULL,
    session_id     INTEGER
);
CREATE INDEX IF NOT EXISTS tenure_nodes_last_heartbeat ON tenure_nodes (last_heartbeat);
CREATE TABLE IF NOT EXISTS tenure_fences (
    resource TEXT PRIMARY KEY NOT NULL,
    highest  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_candidates (
    role       TEXT NOT NULL,
    owner      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    value      TEXT,
    PRIMARY KEY (role, owner)
) WITHOUT ROWID;
";

/// What needs the `session_id` and `value` columns, created once they exist (a schema-2
/// file gains the first in [`add_sessions`], a schema-3 file the second in
/// [`add_values`], which drops the older view). The index is partial so plain leases
/// never touch it; the view is the one place that says when a term ends and which
/// value it shows.
const SESSION_OBJECTS: &str = "
CREATE INDEX IF NOT EXISTS tenure_leases_session ON tenure_leases (session_id)
    WHERE session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS tenure_nodes_session ON tenure_nodes (session_id)
    WHERE session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS tenure_leases_changed ON tenure_leases (changed);
CREATE INDEX IF NOT EXISTS tenure_leases_held_alone ON tenure_leases (role)
    WHERE session_id IS NULL AND holder IS NOT NULL;
CREATE VIEW IF NOT EXISTS tenure_terms AS
    SELECT l.role, l.holder, l.token, coalesce(s.expires_at, l.expires_at) AS expires_at,
           l.session_id,
           CASE WHEN l.holder IS NOT NULL AND l.value_token = l.token THEN l.value END
               AS value,
           l.changed
    FROM tenure_leases l LEFT JOIN tenure_sessions s ON s.id = l.session_id
";

/// Number every change of a lease's term (a new row, and any write of its holder, token
/// or session) with the file's next change number, for reads of what changed
/// (`list_prefix_changes`). Triggers, so every writer numbers its changes, a schema-6
/// tenure still running on a migrated file too. Writes are serialized by the file's
/// write lock, so numbers grow in commit order: a reader whose snapshot shows number `n`
/// as the largest has seen every change numbered up to `n`, and every later change gets
/// a larger one. (Each statement has `;` inside, so they are not in
/// [`SESSION_OBJECTS`].)
const CHANGE_NUMBERS: [&str; 2] = [
    "CREATE TRIGGER IF NOT EXISTS tenure_leases_number_new
AFTER INSERT ON tenure_leases
BEGIN
    UPDATE tenure_leases SET changed = (SELECT max(changed) FROM tenure_leases) + 1
    WHERE role = NEW.role;
END",
    "CREATE TRIGGER IF NOT EXISTS tenure_leases_number_change
AFTER UPDATE OF holder, token, session_id ON tenure_leases
BEGIN
    UPDATE tenure_leases SET changed = (SELECT max(changed) FROM tenure_leases) + 1
    WHERE role = NEW.role;
END",
];

/// Refuses a new term that keeps the session of the term it replaces. This build never
/// writes one (a new term names its own session, or none), but a schema-2 tenure still
/// running on a migrated file would: it reads a session's term by its stale own
/// `expires_at`, takes it over while the session lives and leaves it attached, so two
/// holders would each think the role theirs. The trigger makes that write fail instead
/// (also once the session ended: such a role waits for this build to take it).
/// (One statement with `;` inside, so it is not in [`SESSION_OBJECTS`].)
const SESSION_GUARD: &str = "
CREATE TRIGGER IF NOT EXISTS tenure_leases_new_term_leaves_session
BEFORE UPDATE OF token ON tenure_leases
WHEN OLD.session_id IS NOT NULL AND NEW.session_id IS OLD.session_id
BEGIN
    SELECT RAISE(ABORT, 'this file has tenure schema 3 (sessions): upgrade every tenure using it');
END";

/// Reads the boot id the file's times belong to: the first statement of every write
/// transaction. Public (through `statements`) only so the benchmark issues exactly the
/// store's statement.
#[doc(hidden)]
pub const READ_BOOT: &str = "SELECT boot_id FROM tenure_boot WHERE id = 0";

/// How many boot ids a file remembers. A reboot never brings back an earlier boot id,
/// so one seen before is a second kernel; two kernels alternate between two ids, and
/// a host's own reboots only push old ids out, so a short history tells them apart.
const BOOT_HISTORY: i64 = 64;

/// The history table, for a file an earlier build created (it has no history yet).
/// `booted_at` is when that boot began, on its own wall clock (nanoseconds since the
/// epoch; unknown for the boot a file recorded before the history).
const BOOT_HISTORY_TABLE: &str = "CREATE TABLE IF NOT EXISTS tenure_boot_history (
    seq       INTEGER PRIMARY KEY,
    boot_id   TEXT NOT NULL UNIQUE,
    booted_at INTEGER
)";

/// How much later than this kernel's boot the file's boot may seem to have begun and
/// still be taken for this host's previous boot: wall clocks read at two boots of one
/// host can disagree by a correction made at boot (an RTC off by some seconds).
const BOOT_ORDER_SLACK: Duration = Duration::from_secs(60);

/// A write under `now.boot_id`, which differs from the file's `recorded` boot: starts
/// the new boot (see [`start_boot`]) if the file never saw it, and refuses the write if
/// it did. The file's latest boot is then another kernel's, written after this one's:
/// a second host (or VM) shares the file, and starting this boot again would end that
/// host's live leases, which its holders would go on using.
pub(crate) async fn enter_boot(
    conn: &mut SqliteConnection,
    recorded: Option<&str>,
    now: &StoreNow,
) -> Result<()> {
    let create = sqlx::query(BOOT_HISTORY_TABLE);
    execute(conn, create, "cannot create the boot history").await?;
    if let Some(recorded) = recorded {
        // A file from before the history (or written by such a build since) may not
        // hold its latest boot there yet.
        sqlx::query(
            "INSERT OR IGNORE INTO tenure_boot_history (seq, boot_id) \
             VALUES ((SELECT coalesce(max(seq), 0) + 1 FROM tenure_boot_history), ?1)",
        )
        .bind(recorded)
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot record the boot history"))?;
    }
    let seen: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM tenure_boot_history WHERE boot_id = ?1")
            .bind(&now.boot_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error("cannot read the boot history"))?;
    // A reboot's predecessor began before it. A boot of the file that began after this
    // kernel's own (beyond the slack) is another kernel's, alive as far as anyone knows.
    let this_boot = booted_at(now);
    let recorded_boot: Option<i64> = match recorded {
        Some(recorded) => {
            sqlx::query_scalar("SELECT booted_at FROM tenure_boot_history WHERE boot_id = ?1")
                .bind(recorded)
                .fetch_optional(&mut *conn)
                .await
                .map_err(store_error("cannot read the boot history"))?
                .flatten()
        }
        None => None,
    };
    let slack = BOOT_ORDER_SLACK.as_nanos() as i64;
    if let (Some(theirs), Some(ours)) = (recorded_boot, this_boot) {
        if theirs > ours.saturating_add(slack) {
            return Err(second_kernel(
                recorded,
                now,
                format!(
                    "the file's boot {} began {} s after this host's boot {}, so it is not \
                     this host's previous boot: two kernels (two hosts, or a VM and its \
                     host) share the file, and this write would end the other's leases",
                    recorded.unwrap_or("?"),
                    (theirs - ours) / 1_000_000_000,
                    now.boot_id
                ),
            ));
        }
    }
    if seen.is_some() {
        return Err(second_kernel(
            recorded,
            now,
            format!(
                "the file was last written under boot id {}, after this host's boot {}: two \
                 kernels (two hosts, or a VM and its host) share it, and each would end \
                 the other's leases",
                recorded.unwrap_or("?"),
                now.boot_id
            ),
        ));
    }
    start_boot(conn, now).await?;
    sqlx::query(
        "INSERT INTO tenure_boot_history (seq, boot_id, booted_at) \
         VALUES ((SELECT coalesce(max(seq), 0) + 1 FROM tenure_boot_history), ?1, ?2)",
    )
    .bind(&now.boot_id)
    .bind(this_boot)
    .execute(&mut *conn)
    .await
    .map_err(store_error("cannot record the boot history"))?;
    sqlx::query(
        "DELETE FROM tenure_boot_history \
         WHERE seq <= (SELECT max(seq) FROM tenure_boot_history) - ?1",
    )
    .bind(BOOT_HISTORY)
    .execute(conn)
    .await
    .map(drop)
    .map_err(store_error("cannot trim the boot history"))
}

/// Starts a boot in the file: every lease and every session ends now (tokens stay),
/// every heartbeat and every candidacy is forgotten, and the file records the boot id
/// its times now belong to.
async fn start_boot(conn: &mut SqliteConnection, now: &StoreNow) -> Result<()> {
    let expire = sqlx::query("UPDATE tenure_leases SET expires_at = ?1").bind(now.mono);
    execute(conn, expire, "cannot expire the leases of a past boot").await?;
    for (statement, doing) in [
        // Their times belong to the past boot; the terms held under them read as ended
        // through their own `expires_at`, set just above.
        (
            "DELETE FROM tenure_sessions",
            "cannot end the sessions of a past boot",
        ),
        (
            "DELETE FROM tenure_nodes",
            "cannot forget the heartbeats of a past boot",
        ),
        // Their expiries belong to the past boot too; their contenders queue again.
        (
            "DELETE FROM tenure_candidates",
            "cannot forget the candidates of a past boot",
        ),
    ] {
        execute(conn, sqlx::query(statement), doing).await?;
    }
    record_boot(conn, &now.boot_id).await
}

async fn record_boot(conn: &mut SqliteConnection, boot_id: &str) -> Result<()> {
    let insert = sqlx::query("INSERT OR REPLACE INTO tenure_boot (id, boot_id) VALUES (0, ?1)");
    execute(conn, insert.bind(boot_id), "cannot record the boot id").await
}

/// Creates tenure's tables in the database behind `conn` if they are missing, or
/// migrates older ones (run it inside a write transaction). [`SqliteDatabase::open`]
/// and [`SqliteDatabase::from_pool`] call it; call it yourself only when you fence
/// writes in a database you open some other way.
///
/// [`SqliteDatabase::open`]: crate::SqliteDatabase::open
/// [`SqliteDatabase::from_pool`]: crate::SqliteDatabase::from_pool
pub async fn create_schema(conn: &mut SqliteConnection) -> Result<()> {
    create_schema_at(conn, &SystemHostClock).await
}

/// [`create_schema`] with the clock a migration converts times with.
pub(crate) async fn create_schema_at(
    conn: &mut SqliteConnection,
    clock: &dyn HostClock,
) -> Result<()> {
    run_all(conn, SCHEMA).await?;
    let version: Option<i64> =
        sqlx::query_scalar("SELECT value FROM tenure_meta WHERE key = 'schema_version'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| Error::store(BACKEND, "cannot read the schema version", e))?;
    match version {
        None => {
            sqlx::query("INSERT INTO tenure_meta (key, value) VALUES ('schema_version', ?1)")
                .bind(SCHEMA_VERSION)
                .execute(&mut *conn)
                .await
                .map_err(|e| Error::store(BACKEND, "cannot record the schema version", e))?;
        }
        Some(SCHEMA_VERSION) => {}
        // One step per schema the file lacks, oldest first.
        Some(from @ 1..SCHEMA_VERSION) => {
            if from == 1 {
                migrate_from_wall_clock(conn, &StoreNow::from_host(clock.now()?)?).await?;
            }
            if from <= 2 {
                add_sessions(conn).await?;
            }
            if from <= 3 {
                add_values(conn).await?;
            }
            if from <= 4 {
                add_queue(conn).await?;
            }
            if from <= 5 {
                add_heartbeat_sessions(conn).await?;
            }
            add_change_numbers(conn).await?;
        }
        Some(other) => {
            return Err(Error::store_msg(
                BACKEND,
                format!(
                    "the database has tenure schema version {other}, this build understands \
                     {SCHEMA_VERSION}: upgrade tenure"
                ),
            ))
        }
    }
    // How many terms were handed to each session (`SessionGrant::terms_handed`): a
    // column with a default that a file of this schema version made before it lacks,
    // added without a new version, so a build of that version still opens the file (its
    // handovers are not counted, and a member then hears of one at its next look).
    add_column_unless_present(
        conn,
        "tenure_sessions",
        "terms_handed",
        "INTEGER NOT NULL DEFAULT 0",
    )
    .await?;
    run_all(conn, SESSION_OBJECTS).await?;
    for statement in std::iter::once(SESSION_GUARD).chain(CHANGE_NUMBERS) {
        execute(conn, sqlx::query(statement), "cannot create the schema").await?;
    }
    Ok(())
}

/// Runs `statements` one by one: they have no `;` inside a statement.
async fn run_all(conn: &mut SqliteConnection, statements: &str) -> Result<()> {
    for statement in statements
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        execute(conn, sqlx::query(statement), "cannot create the schema").await?;
    }
    Ok(())
}

/// Ends a migration step: records schema `version` and logs that the file has it now,
/// with `what` that version brought.
async fn migrated_to(conn: &mut SqliteConnection, version: i64, what: &str) -> Result<()> {
    record_version(conn, version).await?;
    tracing::info!("migrated the sqlite store to schema {version}: {what}");
    Ok(())
}

async fn record_version(conn: &mut SqliteConnection, version: i64) -> Result<()> {
    let update = sqlx::query("UPDATE tenure_meta SET value = ?1 WHERE key = 'schema_version'");
    execute(
        conn,
        update.bind(version),
        "cannot record the schema version",
    )
    .await
}

/// Migrates a schema-2 file to sessions: every lease is a plain one (no session), and
/// `tenure_sessions` was created empty with the rest of the schema.
async fn add_sessions(conn: &mut SqliteConnection) -> Result<()> {
    let add = sqlx::query("ALTER TABLE tenure_leases ADD COLUMN session_id INTEGER");
    execute(conn, add, "cannot add sessions to the leases").await?;
    migrated_to(conn, 3, "sessions").await
}

/// Migrates a schema-3 file to advertised values: every existing term advertised
/// none. The `tenure_terms` view is dropped so [`SESSION_OBJECTS`] creates it again
/// with the `value` column (schema-3 readers name their columns, so they read it as
/// before).
async fn add_values(conn: &mut SqliteConnection) -> Result<()> {
    for statement in [
        "ALTER TABLE tenure_leases ADD COLUMN value TEXT",
        "ALTER TABLE tenure_leases ADD COLUMN value_token INTEGER",
        "DROP VIEW IF EXISTS tenure_terms",
    ] {
        execute(
            conn,
            sqlx::query(statement),
            "cannot add values to the leases",
        )
        .await?;
    }
    migrated_to(conn, 4, "advertised values").await
}

/// Migrates a schema-4 file to the queue of candidates: `tenure_candidates` was created
/// empty with the rest of the schema, so nobody is queued. A schema-4 tenure still
/// running on the file knows nothing of the queue: its release frees a role rather than
/// hand it over, and the candidates then contend for it as they would have before.
async fn add_queue(conn: &mut SqliteConnection) -> Result<()> {
    migrated_to(conn, 5, "the queue of candidates").await
}

/// Migrates a schema-5 file to membership through sessions: `tenure_sessions.kept_at`
/// (NULL for the open sessions: they keep no node alive until kept alive again) and
/// `tenure_nodes.session_id` (NULL: no node is kept alive by a session). A table the
/// file created under this build's schema (`tenure_sessions` of a schema-2 file) has
/// its column already. A schema-5 tenure still running on the file neither names nor
/// stamps sessions: its heartbeats leave a node's `session_id` as it was (harmless: the
/// session is its own, and a session it keeps alive stops counting a TTL after its
/// last stamp), and a node it reads is live by its own heartbeats only.
async fn add_heartbeat_sessions(conn: &mut SqliteConnection) -> Result<()> {
    for (table, column) in [
        ("tenure_sessions", "kept_at"),
        ("tenure_nodes", "session_id"),
    ] {
        add_column_unless_present(conn, table, column, "INTEGER").await?;
    }
    migrated_to(conn, 6, "membership through sessions").await
}

/// Migrates a schema-6 file to change numbers: `tenure_leases.changed` (0 for every
/// existing row: a reader's first read is complete), and the `tenure_terms` view is
/// dropped so [`SESSION_OBJECTS`] creates it again with the column. A schema-6 tenure
/// still running on the file numbers its changes through the triggers.
async fn add_change_numbers(conn: &mut SqliteConnection) -> Result<()> {
    let kind = "INTEGER NOT NULL DEFAULT 0";
    add_column_unless_present(conn, "tenure_leases", "changed", kind).await?;
    let drop_view = sqlx::query("DROP VIEW IF EXISTS tenure_terms");
    execute(conn, drop_view, "cannot add change numbers to the leases").await?;
    migrated_to(conn, 7, "change numbers").await
}

/// Adds `column` of `kind` to `table` unless it has it: a table the file created under a
/// later schema than the one it records has it already.
async fn add_column_unless_present(
    conn: &mut SqliteConnection,
    table: &str,
    column: &str,
    kind: &str,
) -> Result<()> {
    let present: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2")
            .bind(table)
            .bind(column)
            .fetch_one(&mut *conn)
            .await
            .map_err(store_error("cannot read the table's columns"))?;
    if present == 0 {
        sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))
            .execute(&mut *conn)
            .await
            .map_err(|e| Error::store(BACKEND, format!("cannot add {table}.{column}"), e))?;
    }
    Ok(())
}

/// Migrates a schema-1 file (wall-clock nanoseconds, with the high-water mark in
/// `tenure_clock`) to monotonic time under the current boot, keeping every token.
///
/// Every stored time moves by the same amount, from the old store time (the wall clock,
/// never below the high-water mark) to the monotonic clock, so each lease and heartbeat
/// keeps exactly the time it had left: a lease live when the file is migrated stays
/// live for the rest of its TTL (its holder may still be an older tenure, which cannot
/// renew once `tenure_clock` is gone and so steps down by its own deadline), and an
/// expired one stays expired.
async fn migrate_from_wall_clock(conn: &mut SqliteConnection, now: &StoreNow) -> Result<()> {
    let high_water: Option<i64> =
        sqlx::query_scalar("SELECT high_water FROM tenure_clock WHERE id = 0")
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error("cannot read the schema-1 store clock"))?;
    let wall = to_nanos(now.wall)
        .map_err(|_| Error::store_msg(BACKEND, "the wall clock reads a time outside 1677..2262"))?;
    let old_now = high_water.map_or(wall, |mark| mark.max(wall));
    let moved = |t: i64| {
        let at = i128::from(t) - i128::from(old_now) + i128::from(now.mono);
        i64::try_from(at.clamp(i128::from(i64::MIN), i128::from(i64::MAX))).unwrap_or(i64::MIN)
    };
    let leases: Vec<(String, i64)> = sqlx::query_as("SELECT role, expires_at FROM tenure_leases")
        .fetch_all(&mut *conn)
        .await
        .map_err(store_error("cannot read the schema-1 leases"))?;
    for (role, expires_at) in &leases {
        sqlx::query("UPDATE tenure_leases SET expires_at = ?2 WHERE role = ?1")
            .bind(role)
            .bind(moved(*expires_at))
            .execute(&mut *conn)
            .await
            .map_err(store_error("cannot migrate a lease"))?;
    }
    let nodes: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT node_id, last_heartbeat, first_seen FROM tenure_nodes")
            .fetch_all(&mut *conn)
            .await
            .map_err(store_error("cannot read the schema-1 nodes"))?;
    for (node_id, last, first) in &nodes {
        sqlx::query(
            "UPDATE tenure_nodes SET last_heartbeat = ?2, first_seen = ?3 WHERE node_id = ?1",
        )
        .bind(node_id)
        .bind(moved(*last))
        .bind(moved(*first))
        .execute(&mut *conn)
        .await
        .map_err(store_error("cannot migrate a node"))?;
    }
    // Gone, so a schema-1 tenure still running on the file fails every call rather
    // than mixing wall-clock times into monotonic ones.
    let drop_clock = "DROP TABLE tenure_clock";
    execute(
        conn,
        sqlx::query(drop_clock),
        "cannot drop the schema-1 store clock",
    )
    .await?;
    record_boot(conn, &now.boot_id).await?;
    record_version(conn, 2).await?;
    tracing::info!(
        leases = leases.len(),
        nodes = nodes.len(),
        "migrated the sqlite store to schema 2: store time is the monotonic clock"
    );
    Ok(())
}

/// Nanoseconds since the Unix epoch, or `Err` outside the years 1677..2262.
pub(crate) fn to_nanos(time: SystemTime) -> std::result::Result<i64, ()> {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).map_err(|_| ()),
        Err(before) => i64::try_from(before.duration().as_nanos())
            .map(|n| -n)
            .map_err(|_| ()),
    }
}

/// The refusal of a write from a second kernel sharing the file (`why`, with the remedy
/// appended), logged.
fn second_kernel(recorded: Option<&str>, now: &StoreNow, why: String) -> Error {
    tracing::error!(
        boot_id = now.boot_id,
        latest = recorded,
        "two kernels write the sqlite store: refusing the write"
    );
    Error::store_msg(
        BACKEND,
        format!(
            "{why}; keep the file on a local disk of one host, or use PostgreSQL or etcd \
             to elect across hosts"
        ),
    )
}

/// When this kernel booted, on its wall clock: the wall clock less the monotonic time
/// since boot. `None` when the wall clock is beyond what the file can hold.
fn booted_at(now: &StoreNow) -> Option<i64> {
    to_nanos(now.wall)
        .ok()
        .map(|wall| wall.saturating_sub(now.mono))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn wall_nanos_cover_1677_to_2262() {
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(to_nanos(epoch + Duration::from_nanos(7)), Ok(7));
        assert_eq!(to_nanos(epoch - Duration::from_secs(5)), Ok(-5_000_000_000));
        assert!(to_nanos(epoch + Duration::from_secs(300 * 365 * 86_400)).is_err());
    }
}
