//! Where tenure's tables live, and how they are created.
//!
//! The schema name is configurable, checked to be a plain identifier and always quoted
//! when put into SQL, so it can never inject anything. [`migrate`] creates the tables
//! idempotently; several processes may call it at once (a transaction-scoped advisory
//! lock serialises the DDL, which `IF NOT EXISTS` alone does not make race-free).

use sqlx::PgPool;
use tenure::{Error, Result};

use crate::error::pg_error;

/// The longest schema name accepted, in bytes. PostgreSQL allows 63; tenure keeps room
/// for the `tenure:` prefix of the notification channel named after the schema.
pub const MAX_SCHEMA_LEN: usize = 48;

/// The default schema: `tenure`.
pub const DEFAULT_SCHEMA: &str = "tenure";

/// Arbitrary constant naming the advisory lock taken around the DDL.
const MIGRATE_LOCK: i64 = 0x7465_6e75_7265_4d47; // "tenureMG"

/// A validated schema name, and the quoted table names derived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    name: String,
}

impl Schema {
    /// Checks `name`: 1 to [`MAX_SCHEMA_LEN`] bytes of ASCII letters, digits and `_`,
    /// not starting with a digit, and not `pg_`-prefixed (reserved by PostgreSQL).
    pub fn new(name: &str) -> Result<Schema> {
        let reason = if name.is_empty() {
            Some("must not be empty".to_owned())
        } else if name.len() > MAX_SCHEMA_LEN {
            Some(format!(
                "is {} bytes long, at most {MAX_SCHEMA_LEN} allowed",
                name.len()
            ))
        } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            Some("must contain only ASCII letters, digits and '_'".to_owned())
        } else if name.as_bytes()[0].is_ascii_digit() {
            Some("must not start with a digit".to_owned())
        } else if name.to_ascii_lowercase().starts_with("pg_") {
            Some("must not start with 'pg_' (reserved by PostgreSQL)".to_owned())
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::invalid("schema", reason)),
            None => Ok(Schema {
                name: name.to_owned(),
            }),
        }
    }

    /// The schema name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema as a quoted SQL identifier.
    pub(crate) fn quoted(&self) -> String {
        quote_ident(&self.name)
    }

    /// `"schema".table`, quoted.
    pub(crate) fn table(&self, table: &str) -> String {
        format!("{}.{}", self.quoted(), quote_ident(table))
    }

    /// The LISTEN/NOTIFY channel lease changes of this schema are announced on.
    pub(crate) fn channel(&self) -> String {
        format!("tenure:{}", self.name)
    }

    /// The LISTEN/NOTIFY channel joins and leaves of this schema's nodes are announced on.
    pub(crate) fn members_channel(&self) -> String {
        format!("tenure-members:{}", self.name)
    }
}

impl Default for Schema {
    fn default() -> Self {
        Schema {
            name: DEFAULT_SCHEMA.to_owned(),
        }
    }
}

/// Quotes an identifier: wraps it in double quotes and doubles any inside.
pub(crate) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Creates the schema and tenure's tables if they do not exist (the queue's
/// `tenure_candidates` among them, which a schema made by an earlier tenure lacks), and
/// adds the columns such a schema lacks (`session_id`, `value`, `value_token`, and for
/// membership through sessions `tenure_sessions.kept_at` and `tenure_nodes.session_id`).
///
/// Needs `CREATE` on the database (for the schema) or an existing schema the role may
/// create tables in. Safe to call from many processes at once, and on every start.
pub async fn migrate(pool: &PgPool, schema: &Schema) -> Result<()> {
    let mut tx = pool
        .begin()
        .await
        .map_err(|e| pg_error("migrate: could not begin a transaction", e))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(|e| pg_error("migrate: could not take the migration lock", e))?;
    let s = schema.quoted();
    let leases = schema.table("tenure_leases");
    let nodes = schema.table("tenure_nodes");
    let fences = schema.table("tenure_fences");
    let terms = schema.table("tenure_advisory_terms");
    let sessions = schema.table("tenure_sessions");
    let candidates = schema.table("tenure_candidates");
    let statements = [
        format!("CREATE SCHEMA IF NOT EXISTS {s}"),
        // A lease row is never deleted: release clears `holder` and keeps the token, so
        // the counter survives everything.
        format!(
            "CREATE TABLE IF NOT EXISTS {leases} (
                role text PRIMARY KEY,
                holder text,
                fencing_token bigint NOT NULL CHECK (fencing_token > 0),
                expires_at timestamptz NOT NULL,
                term_txid bigint NOT NULL
            )"
        ),
        // Sessions are never deleted either (a closed one ends at once): an identity
        // never hands out an id twice, and a lease row naming an ended session reads as
        // expired.
        format!(
            "CREATE TABLE IF NOT EXISTS {sessions} (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                owner text NOT NULL,
                expires_at timestamptz NOT NULL,
                terms_handed bigint NOT NULL DEFAULT 0
            )"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {nodes} (
                node_id text PRIMARY KEY,
                first_seen timestamptz NOT NULL,
                last_heartbeat timestamptz NOT NULL,
                metadata jsonb NOT NULL DEFAULT '{{}}'
            )"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {fences} (
                resource text PRIMARY KEY,
                highest bigint NOT NULL
            )"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {terms} (
                role text PRIMARY KEY,
                term bigint NOT NULL
            )"
        ),
        // The queue of candidates (see `queue.rs`). `IF NOT EXISTS` on a table that
        // exists takes no lock on it, so this costs nothing on every start.
        crate::queue::create_table(&candidates),
    ];
    for statement in &statements {
        sqlx::query(statement)
            .execute(&mut *tx)
            .await
            .map_err(|e| pg_error("migrate: could not create the tenure schema and tables (the role needs CREATE on the database, or on an existing schema)", e))?;
    }
    // A lease table made before sessions existed: `session_id` (the session a term is
    // held under; NULL for a plain lease) and the index closing a session releases its
    // roles through. Partial: plain leases (the common case) never enter it, so their
    // renewals stay HOT updates.
    add_columns_unless_present(
        &mut tx,
        &leases,
        "session_id",
        &[
            format!("ALTER TABLE {leases} ADD COLUMN IF NOT EXISTS session_id bigint"),
            format!(
                "CREATE INDEX IF NOT EXISTS tenure_leases_session_id ON {leases} (session_id)
                 WHERE session_id IS NOT NULL"
            ),
        ],
        "sessions to the lease table",
    )
    .await?;
    // A lease table made before advertised values existed: `value` (what the term
    // advertised when it began; NULL for nothing, and after a release) and
    // `value_token` (the token of the term that wrote `value`: readers show the value
    // only while that term is the row's, so a term an older tenure starts, knowing
    // neither column, never shows its predecessor's value). Existing rows advertised
    // nothing. One statement, so the columns come together; `IF NOT EXISTS` for a table
    // that has one of them already (a hand-made one).
    add_columns_unless_present(
        &mut tx,
        &leases,
        "value_token",
        &[format!(
            "ALTER TABLE {leases} ADD COLUMN IF NOT EXISTS value text,
                ADD COLUMN IF NOT EXISTS value_token bigint"
        )],
        "values to the lease table",
    )
    .await?;
    // Tables made before membership came from sessions (see `registry.rs`):
    // `tenure_sessions.kept_at`, when the session was last opened or kept alive (NULL
    // for a session kept alive only by an older tenure: it then keeps no member alive),
    // and `tenure_nodes.session_id`, the session a node's heartbeat named as keeping it
    // alive (NULL for none), with the partial index a keep-alive finds the node through.
    add_columns_unless_present(
        &mut tx,
        &nodes,
        "session_id",
        &[
            format!("ALTER TABLE {sessions} ADD COLUMN IF NOT EXISTS kept_at timestamptz"),
            format!("ALTER TABLE {nodes} ADD COLUMN IF NOT EXISTS session_id bigint"),
            format!(
                "CREATE INDEX IF NOT EXISTS tenure_nodes_session_id ON {nodes} (session_id)
                 WHERE session_id IS NOT NULL"
            ),
        ],
        "heartbeat sessions to the node and session tables",
    )
    .await?;
    // A session table made before keep-alives told how many terms were handed to the
    // session (`terms_handed`, counted by `hand_to_session`, see `queue.rs`). A constant
    // default: no row is rewritten.
    add_columns_unless_present(
        &mut tx,
        &sessions,
        "terms_handed",
        &[format!(
            "ALTER TABLE {sessions} ADD COLUMN IF NOT EXISTS terms_handed bigint NOT NULL DEFAULT 0"
        )],
        "the count of terms handed to the session table",
    )
    .await?;
    // The indexes reads of what changed go through (see `list_prefix_changes` in
    // `lease.rs`): terms begun or ended after a transaction id, and the held leases of
    // their own (no session), read every time. Neither column moves at a renewal, so
    // renewals stay HOT updates. Checked first, as columns are: `CREATE INDEX` locks the
    // table even when the index is there.
    if !has_relation(&mut tx, &schema.table("tenure_leases_term_txid")).await? {
        for statement in [
            format!(
                "CREATE INDEX IF NOT EXISTS tenure_leases_held_alone ON {leases} (role)
                 WHERE session_id IS NULL AND holder IS NOT NULL"
            ),
            format!("CREATE INDEX IF NOT EXISTS tenure_leases_term_txid ON {leases} (term_txid)"),
        ] {
            sqlx::query(&statement)
                .execute(&mut *tx)
                .await
                .map_err(|e| pg_error("migrate: could not add the indexes of changes", e))?;
        }
    }
    tx.commit()
        .await
        .map_err(|e| pg_error("migrate: could not commit", e))?;
    Ok(())
}

/// Whether relation `name` (a quoted, qualified name: a table, an index) exists.
async fn has_relation(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, name: &str) -> Result<bool> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| pg_error("migrate: could not inspect the schema", e))
}

/// Whether table `table` (a quoted, qualified name) has the column `column`.
async fn has_column(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    table: &str,
    column: &str,
) -> Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute
         WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped)",
    )
    .bind(table)
    .bind(column)
    .fetch_one(&mut **tx)
    .await
    .map_err(|e| pg_error("migrate: could not inspect a table", e))
}

/// One step bringing a table an older tenure made up to date: runs `statements` unless
/// `table` already has `marker`, the column the step adds last, so its presence means
/// the whole step was done (the statements run in `migrate`'s transaction). Checked
/// first because `ALTER TABLE` takes an exclusive lock on the table even when the column
/// is already there, and `migrate` runs on every start. `what` names the step in the
/// error.
async fn add_columns_unless_present(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    table: &str,
    marker: &str,
    statements: &[String],
    what: &str,
) -> Result<()> {
    if has_column(tx, table, marker).await? {
        return Ok(());
    }
    for statement in statements {
        sqlx::query(statement)
            .execute(&mut **tx)
            .await
            .map_err(|e| pg_error(format!("migrate: could not add {what}"), e))?;
    }
    Ok(())
}
