//! [`KubeNodeRegistry`]: heartbeat membership on Lease objects, one per member.
//!
//! A member's object (`tenure.member-ID`) names it as holder; each heartbeat is a
//! conditional write of a new `renewTime`, and its metadata is the `tenure.dev/metadata`
//! annotation (a JSON object). A member is live while this process has seen its object
//! unchanged for less than `leaseDurationSeconds` (see [`crate::observe`]); `leave`
//! clears the holder. A new membership (the first heartbeat, or the first after a lapse
//! or a leave) sets `acquireTime`, which is how every reader tells memberships apart.
//!
//! A process that starts reading counts each member's time from its first read, so for
//! up to one TTL it may list a member that died before it started.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tenure::registry::validate_heartbeat;
use tenure::{Error, Metadata, NodeInfo, NodeRegistry, Result};
use tokio::time::Instant;

use crate::conn::{api_error, is_conflict, KubeConnection};
use crate::links::Link;
use crate::names::{object_name, session_name, Kind};
use crate::record::{
    annotate, corrupt, micro_now, new_object, spec, ttl_secs, Record, HEARTBEAT_SESSION, METADATA,
    NAME,
};
use crate::watch::{Shared, Watch};

const ATTEMPTS: usize = 8;

/// Membership on the Kubernetes API. The TTL is whole seconds, at least one.
pub struct KubeNodeRegistry {
    conn: KubeConnection,
    api: Api<Lease>,
    ttl: Duration,
    secs: i32,
    shared: Arc<Shared>,
    watch: Watch,
    /// Per member object: its membership (`acquireTime`) and when this process first saw it.
    memberships: Mutex<HashMap<String, (String, Instant)>>,
    /// Per member object this registry heartbeats: the object as last written.
    own: Mutex<HashMap<String, OwnBeat>>,
}

impl std::fmt::Debug for KubeNodeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNodeRegistry")
            .field("namespace", &self.conn.namespace)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Members and the sessions that may keep them alive: what membership reads and watches.
fn selector() -> String {
    crate::record::selector(&[Kind::Member.label(), "session"])
}

impl KubeNodeRegistry {
    /// A registry on the connection's namespace; `ttl` must be whole seconds.
    pub fn new(conn: KubeConnection, ttl: Duration) -> Result<KubeNodeRegistry> {
        let secs = ttl_secs("ttl", ttl)?;
        let api = conn.leases();
        Ok(KubeNodeRegistry {
            conn,
            api,
            ttl,
            secs,
            shared: Shared::new(),
            watch: Watch::new(selector()),
            memberships: Mutex::new(HashMap::new()),
            own: Mutex::new(HashMap::new()),
        })
    }

    fn error(&self, verb: &str, object: &str, error: kube::Error) -> Error {
        api_error(&self.conn.namespace, verb, object, error)
    }

    fn membership_start(&self, object: &str, acquired: &str, at: Instant) -> Instant {
        let mut memberships = self.memberships.lock();
        match memberships.get(object) {
            Some((known, first)) if known == acquired => *first,
            _ => {
                memberships.insert(object.to_owned(), (acquired.to_owned(), at));
                at
            }
        }
    }

    /// When `record` (a member object, first seen at `first`) was last heard of as this
    /// process judges it: its own version's first sighting, or a later sighting of the
    /// session it names, while that session is open and held by the member.
    fn last_heard(&self, record: &Record, first: Instant, sessions: &Sessions) -> Instant {
        let Some(session) =
            heartbeat_session(record).and_then(|id| sessions.get(&session_name(id)))
        else {
            return first;
        };
        let (session, seen) = session;
        let open = !session.ended() && session.holder.is_some() && session.holder == record.holder;
        if open {
            first.max(*seen)
        } else {
            first
        }
    }

    /// When this process last kept the member's object alive, itself or through the
    /// session `link` it names.
    fn own_last(&self, own: &OwnBeat, link: Option<Link>) -> Instant {
        match link {
            Some(link) if own.session == Some(link.id) => own.heard.max(link.kept),
            _ => own.heard,
        }
    }

    async fn beat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        validate_heartbeat(node_id, metadata)?;
        let object = object_name(Kind::Member, node_id);
        let encoded = metadata
            .map(|metadata| serde_json::to_string(metadata).map_err(|e| corrupt(e.to_string())))
            .transpose()?;
        let link = self.conn.links.of(node_id);
        let own = self.own.lock().get(&object).cloned();
        if let Some(own) = own {
            let now = self.shared.observer.instant();
            let live = now < self.own_last(&own, link) + self.ttl;
            let same = own.session == link.map(|link| link.id)
                && (encoded.is_none() || encoded == own.metadata);
            // The session's keep-alive was this member's heartbeat: readers count it as
            // one. Only while it is recent, so when keep-alives stop the member's own
            // heartbeats resume at most half a TTL later (see `docs/semantics.md`).
            if let (true, true, Some(link)) = (live, same, link) {
                if now < link.kept + self.ttl / 2 {
                    // Remembered past the session's end, which drops the link.
                    if let Some(own) = self.own.lock().get_mut(&object) {
                        own.heard = own.heard.max(link.kept);
                    }
                    return Ok(());
                }
            }
            // One conditional write on the version this registry wrote, no read first.
            let mut lease = own.record.to_write();
            if let Some(encoded) = &encoded {
                annotate(&mut lease, METADATA, Some(encoded.clone()));
            }
            match self
                .write(&object, node_id, lease, !live, false, link)
                .await?
            {
                Written::Done => return Ok(()),
                Written::Lost => {
                    self.own.lock().remove(&object);
                }
            }
        }
        for _ in 0..ATTEMPTS {
            let current = self
                .shared
                .get(&self.api, &self.conn.namespace, &object)
                .await?;
            let (lease, new_membership, create) = match current {
                None => {
                    let mut lease = new_object(&object, Kind::Member.label(), Some(node_id));
                    annotate(
                        &mut lease,
                        METADATA,
                        Some(encoded.clone().unwrap_or("{}".into())),
                    );
                    (lease, true, true)
                }
                Some((record, first, arrived)) => {
                    let record = Record::read(record.lease, node_id)?;
                    let mut last = first;
                    if let (Some(link), Some(id)) = (link, heartbeat_session(&record)) {
                        if link.id == id {
                            last = last.max(link.kept);
                        }
                    }
                    let lapsed = record.holder.is_none() || arrived >= last + record.duration;
                    let mut lease = record.to_write();
                    if let Some(encoded) = &encoded {
                        annotate(&mut lease, METADATA, Some(encoded.clone()));
                    }
                    (lease, lapsed, false)
                }
            };
            if let Written::Done = self
                .write(&object, node_id, lease, new_membership, create, link)
                .await?
            {
                return Ok(());
            }
        }
        Err(Error::store_msg(
            crate::BACKEND,
            format!("heartbeat of {node_id:?}: lost {ATTEMPTS} conditional writes in a row"),
        ))
    }

    /// Writes a heartbeat into `lease` (a new membership from now when `new_membership`),
    /// naming the session `link` that keeps the member alive, if any: a create or a
    /// `PUT` conditional on the version `lease` carries.
    async fn write(
        &self,
        object: &str,
        node_id: &str,
        mut lease: Lease,
        new_membership: bool,
        create: bool,
        link: Option<Link>,
    ) -> Result<Written> {
        let now = micro_now();
        annotate(
            &mut lease,
            HEARTBEAT_SESSION,
            link.map(|link| format!("{:x}", link.id)),
        );
        let spec = spec(&mut lease);
        spec.holder_identity = Some(node_id.to_owned());
        spec.lease_duration_seconds = Some(self.secs);
        spec.renew_time = Some(now.clone());
        if new_membership {
            spec.acquire_time = Some(now.clone());
        }
        let sent = self.shared.observer.instant();
        let written = if create {
            self.api.create(&PostParams::default(), &lease).await
        } else {
            self.api
                .replace(object, &PostParams::default(), &lease)
                .await
        };
        match written {
            Ok(written) => {
                if let Some(version) = written.metadata.resource_version.as_deref() {
                    self.shared.observer.wrote(object, version, sent);
                }
                if new_membership {
                    self.memberships
                        .lock()
                        .insert(object.to_owned(), (now.0.to_string(), sent));
                }
                let record = Record::read_any(written)?;
                self.own.lock().insert(
                    object.to_owned(),
                    OwnBeat {
                        metadata: record.annotations.get(METADATA).cloned(),
                        session: link.map(|link| link.id),
                        record,
                        heard: sent,
                    },
                );
                Ok(Written::Done)
            }
            Err(error) if is_conflict(&error) => Ok(Written::Lost),
            Err(error) if matches!(&error, kube::Error::Api(s) if s.code == 404) && !create => {
                Ok(Written::Lost)
            }
            Err(error) => {
                let verb = if create { "create" } else { "update" };
                Err(self.error(verb, object, error))
            }
        }
    }
}

/// The member object as this registry last wrote it: the next heartbeat is one write
/// conditional on it.
#[derive(Clone, Debug)]
struct OwnBeat {
    record: Record,
    /// The latest of when that write was sent and the keep-alives of the named session that stood in for
    /// heartbeats since.
    heard: Instant,
    /// The metadata annotation written.
    metadata: Option<String>,
    /// The session named as keeping the member alive.
    session: Option<u64>,
}

/// How a heartbeat write ended.
enum Written {
    Done,
    /// 409 Conflict, or the object is gone: read again.
    Lost,
}

/// Session objects by name, with when this process first saw their versions.
type Sessions = HashMap<String, (Record, Instant)>;

/// The session a member object names as keeping it alive.
fn heartbeat_session(record: &Record) -> Option<u64> {
    record
        .annotations
        .get(HEARTBEAT_SESSION)
        .and_then(|id| u64::from_str_radix(id, 16).ok())
}

#[async_trait]
impl NodeRegistry for KubeNodeRegistry {
    async fn record_heartbeat(&self, node_id: &str, metadata: Option<&Metadata>) -> Result<()> {
        self.beat(node_id, metadata).await
    }

    async fn members(&self) -> Result<Vec<NodeInfo>> {
        let (records, arrived) = self
            .shared
            .list(&self.api, &self.conn.namespace, &selector())
            .await?;
        let wall = |at: Instant| -> SystemTime { self.shared.observer.wall(at) };
        let (sessions, records): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|(record, _)| record.kind() == Some("session"));
        let sessions: Sessions = sessions
            .into_iter()
            .map(|(record, first)| (record.object.clone(), (record, first)))
            .collect();
        let mut members = Vec::new();
        for (record, first) in records {
            let (Some(node_id), Some(_)) = (record.annotations.get(NAME), &record.holder) else {
                continue;
            };
            let last = self.last_heard(&record, first, &sessions);
            if arrived >= last + record.duration {
                continue;
            }
            let acquired = record
                .lease
                .spec
                .as_ref()
                .and_then(|spec| spec.acquire_time.as_ref())
                .map(|time| time.0.to_string())
                .unwrap_or_default();
            let since = self.membership_start(&record.object, &acquired, first);
            let metadata = match record.annotations.get(METADATA) {
                Some(raw) => serde_json::from_str(raw).map_err(|error| {
                    corrupt(format!(
                        "{} has unreadable metadata: {error}",
                        record.object
                    ))
                })?,
                None => Metadata::new(),
            };
            members.push(NodeInfo {
                node_id: node_id.clone(),
                last_heartbeat: wall(last),
                first_seen: wall(since),
                metadata,
                now: wall(arrived),
            });
        }
        members.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        Ok(members)
    }

    async fn leave(&self, node_id: &str) -> Result<bool> {
        validate_heartbeat(node_id, None)?;
        let object = object_name(Kind::Member, node_id);
        self.own.lock().remove(&object);
        let link = self.conn.links.of(node_id);
        for _ in 0..ATTEMPTS {
            let Some((record, first, arrived)) = self
                .shared
                .get(&self.api, &self.conn.namespace, &object)
                .await?
            else {
                return Ok(false);
            };
            let record = Record::read(record.lease, node_id)?;
            if record.holder.is_none() {
                return Ok(false);
            }
            // Heard of through its session too: this process's keep-alives of it, or the
            // newest sighting of it here.
            let mut last = first;
            if let Some(id) = heartbeat_session(&record) {
                if let Some(link) = link.filter(|link| link.id == id) {
                    last = last.max(link.kept);
                }
                if let Some((_, seen)) = self.shared.observer.latest(&session_name(id)) {
                    last = last.max(seen);
                }
            }
            let was_live = arrived < last + record.duration;
            let mut lease = record.to_write();
            let spec = spec(&mut lease);
            spec.holder_identity = None;
            spec.renew_time = Some(micro_now());
            match self
                .api
                .replace(&object, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => return Ok(was_live),
                Err(error) if is_conflict(&error) => continue,
                Err(error) => return Err(self.error("update", &object, error)),
            }
        }
        Err(Error::store_msg(
            crate::BACKEND,
            format!("leave of {node_id:?}: lost {ATTEMPTS} conditional writes in a row"),
        ))
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn wait_for_members_change(&self, observed: &[String], deadline: tokio::time::Instant) {
        self.watch.ensure(&self.api, &self.shared);
        let changed = self.shared.any.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        match self.live_nodes().await {
            Ok(live) if live != observed => return,
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "reading members before waiting failed"),
        }
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}
