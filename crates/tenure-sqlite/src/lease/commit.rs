//! Committing a store write, and what a write that begins or ends terms tells once it
//! is committed (this process's waiters, the process watching each role, a candidate
//! handed a role, the membership's waiters), on a task of its own so that a caller that
//! gives up cannot leave a committed term unannounced.

use sqlx::{Sqlite, Transaction};
use tenure::Result;

use super::LeaseWrite;
use crate::database::{store_error, SqliteDatabase, WriterSlot};

/// Commits a store write. Also when nothing was written: the transaction may have
/// started a new boot, which every later call must see.
pub(super) async fn commit(tx: Transaction<'static, Sqlite>, doing: &str) -> Result<()> {
    tx.commit().await.map_err(store_error(doing))
}

/// Whether `write` began a term (first, or taken over), not renewed or refused one.
pub(super) fn new_term(write: &LeaseWrite) -> bool {
    matches!(write, LeaseWrite::Written { new_term: true, .. })
}

/// What a write tells once it is committed: the roles whose terms it began or ended
/// (to this process's waiters and the process watching each), the candidate it handed
/// a role to (woken wherever it waits), and whether the membership may have changed.
#[derive(Debug, Default)]
pub(super) struct News {
    pub(super) terms: Vec<String>,
    pub(super) handed: Option<(String, String)>,
    pub(super) membership: bool,
}

impl News {
    /// The news of one write of `role`: a term that began or ended if `changed`.
    pub(super) fn of_role(role: &str, changed: bool) -> News {
        News {
            terms: changed.then(|| role.to_owned()).into_iter().collect(),
            ..News::default()
        }
    }

    fn tell(self, db: &SqliteDatabase) {
        if let Some((candidate, role)) = &self.handed {
            db.wake(candidate, role);
        }
        for role in &self.terms {
            db.announce_term(role);
        }
        if self.membership {
            db.signal_change(crate::registry::MEMBERSHIP);
        }
    }
}

/// Commits a write that changes terms, then tells its `news` (see
/// [`SqliteDatabase::commit_then`]).
pub(super) async fn commit_and_tell(
    db: &SqliteDatabase,
    writer: WriterSlot,
    tx: Transaction<'static, Sqlite>,
    doing: &'static str,
    news: News,
) -> Result<()> {
    let db = db.clone();
    SqliteDatabase::commit_then(writer, tx, doing, async move { news.tell(&db) }).await
}
