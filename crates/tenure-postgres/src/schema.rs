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

/// Creates the schema and tenure's tables if they do not exist.
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
    ];
    for statement in &statements {
        sqlx::query(statement)
            .execute(&mut *tx)
            .await
            .map_err(|e| pg_error("migrate: could not create the tenure schema and tables (the role needs CREATE on the database, or on an existing schema)", e))?;
    }
    tx.commit()
        .await
        .map_err(|e| pg_error("migrate: could not commit", e))?;
    Ok(())
}
