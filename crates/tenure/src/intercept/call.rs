//! A call through an [`InterceptStore`](super::InterceptStore) as plain data: the
//! [`Call`] with its arguments, and the [`Reply`] the store (or an interceptor) gives.

use std::time::Duration;

use tokio::time::Instant;

#[cfg(doc)]
use super::{InterceptStore, Interceptor};
#[cfg(doc)]
use crate::LeaseStore;
use crate::{
    ChangeMark, Error, FencingToken, LeaseInfo, LeaseResult, PrefixChanges, Result, SessionGrant,
    SessionId, TermChange,
};

/// One call to a [`LeaseStore`], with its arguments, as an [`Interceptor`] sees it.
///
/// The arguments are owned so that an interceptor can move the call into a task of its
/// own. New variants may come with new store methods: match with a catch-all arm that
/// passes the call on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Call {
    /// [`LeaseStore::try_acquire_or_renew`],
    /// [`LeaseStore::try_acquire_or_renew_with_value`] and (with `queue` set)
    /// [`LeaseStore::try_acquire_or_queue`].
    TryAcquireOrRenew {
        /// The role.
        role: String,
        /// The contender.
        owner: String,
        /// The TTL asked for.
        ttl: Duration,
        /// The value a new term advertises.
        value: Option<String>,
        /// Whether a caller that does not acquire is queued as a candidate.
        queue: bool,
    },
    /// [`LeaseStore::candidates`].
    Candidates {
        /// The role.
        role: String,
    },
    /// [`LeaseStore::withdraw`].
    Withdraw {
        /// The role.
        role: String,
        /// The candidate leaving the queue.
        owner: String,
    },
    /// [`LeaseStore::hand_over`].
    HandOver {
        /// The role.
        role: String,
        /// The holder handing over.
        owner: String,
        /// The token of the term to end.
        token: FencingToken,
        /// The candidate to begin the next term; `None` for the oldest.
        successor: Option<String>,
    },
    /// [`LeaseStore::hand_to_session`].
    HandToSession {
        /// The role.
        role: String,
        /// The holder handing over.
        owner: String,
        /// The token of the term to end.
        token: FencingToken,
        /// The owner whose newest live session begins the next term.
        to: String,
    },
    /// [`LeaseStore::release`].
    Release {
        /// The role.
        role: String,
        /// The holder releasing.
        owner: String,
        /// The token of the term to end.
        token: FencingToken,
    },
    /// [`LeaseStore::get`].
    Get {
        /// The role.
        role: String,
    },
    /// [`LeaseStore::list_prefix`] (and so [`LeaseStore::list`], with an empty prefix).
    List {
        /// The roles' prefix; empty for every role.
        prefix: String,
    },
    /// [`LeaseStore::list_prefix_changes`].
    ListChanges {
        /// The roles' prefix.
        prefix: String,
        /// Where the caller's last read left off; `None` for a complete read.
        since: Option<ChangeMark>,
        /// The sessions whose time left the caller asks.
        sessions: Vec<SessionId>,
    },
    /// [`LeaseStore::wait_for_change`].
    WaitForChange {
        /// The role.
        role: String,
        /// The token of the term the caller saw.
        observed: FencingToken,
        /// When the caller stops waiting.
        deadline: Instant,
    },
    /// [`LeaseStore::wait_for_successor`].
    WaitForSuccessor {
        /// The role.
        role: String,
        /// The token of the term the caller saw.
        observed: FencingToken,
        /// When the caller stops waiting.
        deadline: Instant,
    },
    /// [`LeaseStore::wait_for_term`].
    WaitForTerm {
        /// The role.
        role: String,
        /// The token of the latest term the caller saw.
        after: FencingToken,
        /// When the caller stops waiting.
        deadline: Instant,
    },
    /// [`LeaseStore::open_session`].
    OpenSession {
        /// The owner.
        owner: String,
        /// The session TTL.
        ttl: Duration,
    },
    /// [`LeaseStore::keep_alive_session`].
    KeepAliveSession {
        /// The session.
        session: SessionId,
        /// The session TTL.
        ttl: Duration,
    },
    /// [`LeaseStore::acquire_in_session`].
    AcquireInSession {
        /// The role.
        role: String,
        /// The session to hold it under.
        session: SessionId,
    },
    /// [`LeaseStore::acquire_many_in_session`].
    AcquireManyInSession {
        /// The roles, in the order their answers come.
        roles: Vec<String>,
        /// The session to hold them under.
        session: SessionId,
    },
    /// [`LeaseStore::close_session`].
    CloseSession {
        /// The session.
        session: SessionId,
    },
}

impl Call {
    /// The name of the store method this call is for (`"release"`, ...), for logs.
    pub fn method(&self) -> &'static str {
        match self {
            Call::TryAcquireOrRenew { queue: false, .. } => "try_acquire_or_renew",
            Call::TryAcquireOrRenew { queue: true, .. } => "try_acquire_or_queue",
            Call::Candidates { .. } => "candidates",
            Call::Withdraw { .. } => "withdraw",
            Call::HandOver { .. } => "hand_over",
            Call::HandToSession { .. } => "hand_to_session",
            Call::Release { .. } => "release",
            Call::Get { .. } => "get",
            Call::List { .. } => "list",
            Call::ListChanges { .. } => "list_changes",
            Call::WaitForChange { .. } => "wait_for_change",
            Call::WaitForSuccessor { .. } => "wait_for_successor",
            Call::WaitForTerm { .. } => "wait_for_term",
            Call::OpenSession { .. } => "open_session",
            Call::KeepAliveSession { .. } => "keep_alive_session",
            Call::AcquireInSession { .. } => "acquire_in_session",
            Call::AcquireManyInSession { .. } => "acquire_many_in_session",
            Call::CloseSession { .. } => "close_session",
        }
    }
}

/// The answer to one [`Call`]: the variant of the call's method.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reply {
    /// From [`Call::TryAcquireOrRenew`] and [`Call::AcquireInSession`].
    Lease(Result<LeaseResult>),
    /// From [`Call::Release`], [`Call::HandOver`], [`Call::HandToSession`],
    /// [`Call::Withdraw`] and
    /// [`Call::CloseSession`].
    Released(Result<bool>),
    /// From [`Call::OpenSession`].
    Session(Result<SessionGrant>),
    /// From [`Call::KeepAliveSession`].
    KeptAlive(Result<Option<SessionGrant>>),
    /// From [`Call::Get`].
    Info(Result<Option<LeaseInfo>>),
    /// From [`Call::List`].
    List(Result<Vec<LeaseInfo>>),
    /// From [`Call::ListChanges`].
    Changes(Result<PrefixChanges>),
    /// From [`Call::WaitForChange`] and [`Call::WaitForTerm`]: the wait ended.
    Changed,
    /// From [`Call::WaitForSuccessor`]: the wait ended with what it learned.
    Succession(TermChange),
    /// From [`Call::Candidates`].
    Candidates(Result<Vec<String>>),
    /// From [`Call::AcquireManyInSession`]: one answer per role, in order.
    Leases(Result<Vec<LeaseResult>>),
}

impl Reply {
    /// The answer to `call` failing with `error`.
    ///
    /// A wait cannot fail: its caller reads the store again when it returns, and sees
    /// the failure there. So for [`Call::WaitForChange`] and [`Call::WaitForTerm`] the
    /// error is dropped and the wait ends at once ([`Call::WaitForSuccessor`]: having
    /// learned nothing, [`TermChange::Unknown`]).
    pub fn error(call: &Call, error: Error) -> Reply {
        match call {
            Call::TryAcquireOrRenew { .. } => Reply::Lease(Err(error)),
            Call::Release { .. }
            | Call::HandOver { .. }
            | Call::HandToSession { .. }
            | Call::Withdraw { .. } => Reply::Released(Err(error)),
            Call::Get { .. } => Reply::Info(Err(error)),
            Call::List { .. } => Reply::List(Err(error)),
            Call::ListChanges { .. } => Reply::Changes(Err(error)),
            Call::WaitForChange { .. } | Call::WaitForTerm { .. } => Reply::Changed,
            Call::WaitForSuccessor { .. } => Reply::Succession(TermChange::Unknown),
            Call::Candidates { .. } => Reply::Candidates(Err(error)),
            Call::OpenSession { .. } => Reply::Session(Err(error)),
            Call::KeepAliveSession { .. } => Reply::KeptAlive(Err(error)),
            Call::AcquireInSession { .. } => Reply::Lease(Err(error)),
            Call::AcquireManyInSession { .. } => Reply::Leases(Err(error)),
            Call::CloseSession { .. } => Reply::Released(Err(error)),
        }
    }

    /// The answer of a [`Call::TryAcquireOrRenew`]; an error if an interceptor answered
    /// it with the reply to another method.
    pub fn into_lease(self) -> Result<LeaseResult> {
        match self {
            Reply::Lease(result) => result,
            other => Err(other.mismatch("try_acquire_or_renew")),
        }
    }

    /// The answer of a [`Call::Release`]; an error if it is the reply to another method.
    pub fn into_released(self) -> Result<bool> {
        match self {
            Reply::Released(result) => result,
            other => Err(other.mismatch("release")),
        }
    }

    /// The answer of a [`Call::WaitForSuccessor`]; [`TermChange::Unknown`] if an
    /// interceptor answered it with the reply to another method (a wait cannot fail).
    pub fn into_succession(self) -> TermChange {
        match self {
            Reply::Succession(change) => change,
            _ => TermChange::Unknown,
        }
    }

    /// The answer of a [`Call::Candidates`]; an error if it is the reply to another
    /// method.
    pub fn into_candidates(self) -> Result<Vec<String>> {
        match self {
            Reply::Candidates(result) => result,
            other => Err(other.mismatch("candidates")),
        }
    }

    /// The answer of a [`Call::Get`]; an error if it is the reply to another method.
    pub fn into_info(self) -> Result<Option<LeaseInfo>> {
        match self {
            Reply::Info(result) => result,
            other => Err(other.mismatch("get")),
        }
    }

    /// The answer of a [`Call::List`]; an error if it is the reply to another method.
    pub fn into_list(self) -> Result<Vec<LeaseInfo>> {
        match self {
            Reply::List(result) => result,
            other => Err(other.mismatch("list")),
        }
    }

    /// The answer of a [`Call::ListChanges`]; an error if it is the reply to another
    /// method.
    pub fn into_changes(self) -> Result<PrefixChanges> {
        match self {
            Reply::Changes(result) => result,
            other => Err(other.mismatch("list_changes")),
        }
    }

    /// A bug in an interceptor, reported to the caller rather than panicking inside a
    /// store call.
    pub(super) fn mismatch(&self, method: &str) -> Error {
        let answered = match self {
            Reply::Lease(_) => "try_acquire_or_renew",
            Reply::Released(_) => "release",
            Reply::Info(_) => "get",
            Reply::List(_) => "list",
            Reply::Changes(_) => "list_changes",
            Reply::Changed => "wait_for_change",
            Reply::Succession(_) => "wait_for_successor",
            Reply::Candidates(_) => "candidates",
            Reply::Leases(_) => "acquire_many_in_session",
            Reply::Session(_) => "open_session",
            Reply::KeptAlive(_) => "keep_alive_session",
        };
        Error::store_msg(
            "intercept",
            format!("an interceptor answered {method} with the reply to {answered}"),
        )
    }
}
