//! [`Faults`]: an [`Interceptor`] of one-shot rules that makes a store's calls fail in
//! the ways a network does, deterministically. A rule catches one call of one owner and
//! either passes it to the store and answers its caller with an error instead (a lost
//! answer), or holds it before the store until the scenario lets it land (a late call).
//! A caught call runs on a task of its own, so it reaches the store even if its caller
//! stops waiting for it, as a request already sent does. The queue's and the shard
//! groups' fault scenarios ([`crate::queue_faults`], [`crate::shard_faults`]) share it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tenure::intercept::{Call, InterceptStore, Interceptor, Next, Reply};
use tenure::{Error, LeaseStore, SessionId};
use tokio_util::sync::CancellationToken;

use crate::{LeaseBackend, LeaseFixture, PATIENCE};

/// What a [`Faults`] rule does to the call it catches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The call reaches the store; its caller gets an error instead of the answer.
    LoseAnswer,
    /// The call waits before the store until [`Caught::land`], then reaches it.
    Hold,
    /// The call reaches the store at once; its caller gets an error instead of the
    /// answer, and only once [`Caught::land`] (the answer is lost, and slow to fail).
    LoseAnswerLate,
}

/// A call the store applies after its caller stopped waiting, and what the caller got:
/// the late calls of the randomized simulations, which both draw them alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Late {
    /// The caller got an error (a connection reset after the request was sent).
    Failed,
    /// The caller never got an answer and gave up at its own deadline.
    Unanswered,
    /// Broken store: the caller was told it was done.
    Acknowledged,
}

impl Late {
    /// What the caller of `call` (on the in-memory store) is told; `None` when it is
    /// told nothing, ever.
    pub fn answer(self, call: &Call) -> Option<Reply> {
        match self {
            Late::Failed => Some(Reply::error(
                call,
                Error::store_msg("memory", "connection reset after the request was sent"),
            )),
            Late::Acknowledged => Some(Reply::Released(Ok(true))),
            Late::Unanswered => None,
        }
    }
}

/// One call a [`Faults`] rule caught: when it arrived, and what the store answered.
#[derive(Debug, Default)]
pub struct Caught {
    arrived: CancellationToken,
    open: CancellationToken,
    applied: CancellationToken,
    reply: Mutex<Option<Reply>>,
}

impl Caught {
    /// Waits (bounded) until the caught call has reached the interceptor.
    pub async fn arrived(&self) {
        tokio::time::timeout(PATIENCE, self.arrived.cancelled())
            .await
            .expect("the caught call never arrived");
    }

    /// Lets a held call go on to the store.
    pub fn land(&self) {
        self.open.cancel();
    }

    /// Waits (bounded) until the store answered the caught call, and returns that
    /// answer (which its caller may never have seen).
    pub async fn store_answer(&self) -> Reply {
        tokio::time::timeout(PATIENCE, self.applied.cancelled())
            .await
            .expect("the caught call never reached the store");
        self.reply
            .lock()
            .unwrap()
            .take()
            .expect("the store's answer, taken once")
    }
}

struct Rule {
    method: &'static str,
    owner: String,
    fault: Fault,
    caught: Arc<Caught>,
}

/// An [`Interceptor`] of one-shot rules: each catches the next call of one method by
/// one owner (see the module docs); every other call passes untouched. A session's calls
/// (`acquire_many_in_session`, `keep_alive_session`, ...) name no owner: they are the
/// calls of the owner the session was opened for through this interceptor.
#[derive(Default)]
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    /// The owner of every session opened through this interceptor.
    sessions: Arc<Mutex<HashMap<SessionId, String>>>,
}

impl Faults {
    /// The next `method` call (as [`Call::method`] names it) by `owner` reaches the
    /// store, and its caller gets a store error instead of the answer.
    pub fn lose_answer(&self, method: &'static str, owner: &str) -> Arc<Caught> {
        self.add(method, owner, Fault::LoseAnswer)
    }

    /// The next `method` call by `owner` waits before the store until
    /// [`Caught::land`].
    pub fn hold(&self, method: &'static str, owner: &str) -> Arc<Caught> {
        self.add(method, owner, Fault::Hold)
    }

    /// The next `method` call by `owner` reaches the store at once, and its caller gets
    /// a store error instead of the answer once [`Caught::land`]: the scenario acts
    /// between the store applying the call and the caller learning it failed.
    pub fn lose_answer_late(&self, method: &'static str, owner: &str) -> Arc<Caught> {
        self.add(method, owner, Fault::LoseAnswerLate)
    }

    /// The sessions opened for `owner` through this interceptor, oldest first.
    pub fn sessions_of(&self, owner: &str) -> Vec<SessionId> {
        let mut ids: Vec<SessionId> = (self.sessions.lock().unwrap().iter())
            .filter(|(_, of)| *of == owner)
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids
    }

    fn add(&self, method: &'static str, owner: &str, fault: Fault) -> Arc<Caught> {
        let caught = Arc::new(Caught::default());
        self.rules.lock().unwrap().push(Rule {
            method,
            owner: owner.to_owned(),
            fault,
            caught: caught.clone(),
        });
        caught
    }

    /// Takes the first rule that catches `call`.
    fn catch(&self, call: &Call) -> Option<(Fault, Arc<Caught>)> {
        let owner = match call {
            Call::TryAcquireOrRenew { owner, .. }
            | Call::Withdraw { owner, .. }
            | Call::HandOver { owner, .. }
            | Call::Release { owner, .. }
            | Call::OpenSession { owner, .. } => owner.clone(),
            Call::KeepAliveSession { session, .. }
            | Call::AcquireInSession { session, .. }
            | Call::AcquireManyInSession { session, .. }
            | Call::CloseSession { session } => self.sessions.lock().unwrap().get(session)?.clone(),
            _ => return None,
        };
        let mut rules = self.rules.lock().unwrap();
        let at = rules
            .iter()
            .position(|rule| rule.method == call.method() && rule.owner == owner)?;
        let rule = rules.remove(at);
        Some((rule.fault, rule.caught))
    }
}

#[async_trait]
impl Interceptor for Faults {
    async fn intercept(&self, call: Call, next: Next) -> Reply {
        let Some((fault, caught)) = self.catch(&call) else {
            let reply = next.run(call).await;
            learn(&self.sessions, &reply);
            return reply;
        };
        caught.arrived.cancel();
        // A caught call is on its way to the store: it gets there even if its caller
        // stops waiting for the answer (as a request already sent does), so it runs on
        // a task of its own.
        let sessions = self.sessions.clone();
        let sent = call.clone();
        let on_its_way = tokio::spawn(async move {
            if fault == Fault::Hold {
                caught.open.cancelled().await;
            }
            let reply = next.run(call.clone()).await;
            learn(&sessions, &reply);
            let answer = match fault {
                // The late caller gave up long ago; whatever it is told, the scenario
                // reads the store's answer from `caught`.
                Fault::Hold => Reply::error(
                    &call,
                    Error::store_msg("intercept", "injected: the call was applied late"),
                ),
                Fault::LoseAnswer | Fault::LoseAnswerLate => Reply::error(
                    &call,
                    Error::store_msg("intercept", "injected: the answer was lost"),
                ),
            };
            *caught.reply.lock().unwrap() = Some(reply);
            caught.applied.cancel();
            if fault == Fault::LoseAnswerLate {
                caught.open.cancelled().await;
            }
            answer
        });
        on_its_way.await.unwrap_or_else(|_| {
            Reply::error(
                &sent,
                Error::store_msg("intercept", "the caught call's task failed"),
            )
        })
    }
}

/// Notes the owner of a session the store opened.
fn learn(sessions: &Mutex<HashMap<SessionId, String>>, reply: &Reply) {
    if let Reply::Session(Ok(grant)) = reply {
        (sessions.lock().unwrap()).insert(grant.id, grant.owner.clone());
    }
}

/// A fixture's store behind a fresh [`Faults`], and another instance of it (as another
/// process) that reads what a scenario checks: what both fault sets start from.
pub(crate) struct Faulted {
    /// The fixture: its storage (and server connections) for the scenario's life, and
    /// its clock.
    pub(crate) fx: Box<dyn LeaseFixture>,
    pub(crate) faults: Arc<Faults>,
    /// The fixture's store behind `faults`.
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) reader: Arc<dyn LeaseStore>,
    pub(crate) ttl: std::time::Duration,
}

impl Faulted {
    pub(crate) async fn new(backend: &dyn LeaseBackend) -> Faulted {
        let fx = backend.create().await;
        let faults = Arc::new(Faults::default());
        let store: Arc<dyn LeaseStore> =
            Arc::new(InterceptStore::new(fx.store()).with(faults.clone()));
        let reader = fx.reopen().await;
        let ttl = fx.ttl();
        Faulted {
            fx,
            faults,
            store,
            reader,
            ttl,
        }
    }
}
