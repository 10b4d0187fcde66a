//! The store's reads of the lease table: whether a term is still live, who holds a role
//! next, one role's row and listings, each on store time.

use super::*;

impl SqliteLeaseStore {
    /// Whether `(role, observed)` is still the live term, on store time.
    pub(super) async fn is_live_term(&self, role: &str, observed: i64) -> Result<bool> {
        let Some((current, now)) = self.read_term(role).await? else {
            return Ok(false);
        };
        Ok(current.is_live_term(observed, now))
    }

    /// What replaced the term `observed` of `role`, from one read of its row: `None`
    /// while it is the live term. (`observed` is `None` for a token never handed out.)
    pub(super) async fn succession(
        &self,
        role: &str,
        observed: Option<i64>,
    ) -> Result<Option<TermChange>> {
        let Some((current, now)) = self.read_term(role).await? else {
            return Ok(Some(TermChange::Ended));
        };
        let live = now < current.expires_at;
        Ok(match current.holder {
            Some(_) if live && Some(current.token) == observed => None,
            Some(holder) if live => Some(TermChange::Began {
                holder,
                fencing_token: token_from_db(current.token)?,
                session: current.session_id.map(session_from_db).transpose()?,
            }),
            _ => Some(TermChange::Ended),
        })
    }

    /// The term of `role` and store time, from one read; a term written under another
    /// boot reads as ended (its time means nothing now). `None` when the role has no row.
    pub(super) async fn read_term(&self, role: &str) -> Result<Option<(LeaseRow, i64)>> {
        let now = self.db.read_now()?;
        let row = sqlx::query(
            "SELECT holder, token, expires_at, \
             coalesce((SELECT boot_id FROM tenure_boot WHERE id = 0) = ?2, 0), session_id \
             FROM tenure_terms WHERE role = ?1",
        )
        .bind(role)
        .bind(&now.boot_id)
        .fetch_optional(self.db.pool())
        .await
        .map_err(store_error("cannot read the lease"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let this_boot: bool = column(&row, 3)?;
        let current = LeaseRow {
            holder: column(&row, 0)?,
            token: column(&row, 1)?,
            expires_at: if this_boot {
                column(&row, 2)?
            } else {
                now.mono
            },
            session_id: column(&row, 4)?,
        };
        Ok(Some((current, now.mono)))
    }

    /// Whether `role` has no term with a token above `after` yet. Tokens survive a new
    /// boot, so no boot check is needed.
    pub(super) async fn no_term_after(&self, role: &str, after: i64) -> Result<bool> {
        let token: Option<i64> = sqlx::query_scalar(READ_TOKEN)
            .bind(role)
            .fetch_optional(self.db.pool())
            .await
            .map_err(store_error("cannot read the lease"))?;
        Ok(token.is_none_or(|token| token <= after))
    }

    pub(super) fn info_from(
        &self,
        row: &sqlx::sqlite::SqliteRow,
        now: &StoreNow,
    ) -> Result<LeaseInfo> {
        let role: String = column(row, 0)?;
        let holder: Option<String> = column(row, 1)?;
        let token: i64 = column(row, 2)?;
        let this_boot: bool = column(row, 4)?;
        // Under another boot the time means nothing: the lease ended by now.
        let expires_at: i64 = if this_boot { column(row, 3)? } else { now.mono };
        Ok(LeaseInfo {
            role,
            holder,
            fencing_token: token_from_db(token)?,
            expires_at: now.wall_at(expires_at)?,
            now: now.wall,
            value: column(row, 5)?,
        })
    }

    /// The leases of `role` (every role for `None`) that start with `prefix`.
    pub(super) async fn read_leases(
        &self,
        role: Option<&str>,
        prefix: &str,
    ) -> Result<Vec<LeaseInfo>> {
        let now = self.db.read_now()?;
        // One statement, so the leases and the boot they belong to come from one snapshot.
        let rows = sqlx::query(
            "SELECT role, holder, token, expires_at, \
             coalesce((SELECT boot_id FROM tenure_boot WHERE id = 0) = ?2, 0), value \
             FROM tenure_terms WHERE (?1 IS NULL OR role = ?1) \
             AND substr(role, 1, length(?3)) = ?3 ORDER BY role",
        )
        .bind(role)
        .bind(&now.boot_id)
        .bind(prefix)
        .fetch_all(self.db.pool())
        .await
        .map_err(store_error("cannot read leases"))?;
        rows.iter().map(|row| self.info_from(row, &now)).collect()
    }
}
