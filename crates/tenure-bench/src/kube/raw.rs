//! The raw side: the requests client-go's `LeaderElector` sends for each operation, sent
//! directly with kube-rs on plain `Lease` objects.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tenure::Result;
use tenure_kube::names::{object_name, Kind};

use super::{err, holder, micro_now, secs, RUN_LABEL};
use crate::backend::{unexpected, Client, BENCH_TTL, REGISTRY_TTL};

/// The raw side of one client: client-go's requests, sent directly.
pub(super) struct RawClient {
    pub(super) api: Api<Lease>,
    /// Each object as this client last wrote it: a bare `PUT` sends it back.
    cached: HashMap<String, Lease>,
    /// Renew and release with a bare `PUT` on the cached object (client-go's fast path),
    /// not `GET` then `PUT`.
    bare: bool,
    run_id: String,
}

impl RawClient {
    pub(super) fn new(api: Api<Lease>, run_id: &str, bare: bool) -> RawClient {
        RawClient {
            api,
            cached: HashMap::new(),
            bare,
            run_id: run_id.to_owned(),
        }
    }

    /// A conditional `PUT` of `lease` (on the `resourceVersion` it carries); the object
    /// as written is kept for the next bare `PUT`.
    async fn put(&mut self, name: &str, lease: Lease, what: &'static str) -> Result<Lease> {
        let written = self
            .api
            .replace(name, &PostParams::default(), &lease)
            .await
            .map_err(err(what))?;
        self.cached.insert(name.to_owned(), written.clone());
        Ok(written)
    }

    async fn get(&self, name: &str, what: &'static str) -> Result<Option<Lease>> {
        self.api.get_opt(name).await.map_err(err(what))
    }

    /// `GET`, or with `bare` the object this client last wrote.
    async fn current(&self, name: &str, what: &'static str) -> Result<Lease> {
        let current = if self.bare {
            self.cached.get(name).cloned()
        } else {
            self.get(name, what).await?
        };
        current.ok_or_else(|| unexpected(format!("{what}: no object {name}")))
    }

    pub(super) fn version_of(&self, name: &str) -> Result<String> {
        self.cached
            .get(name)
            .and_then(|lease| lease.metadata.resource_version.clone())
            .ok_or_else(|| unexpected(format!("no resourceVersion of {name} kept")))
    }

    /// Writes `owner` in as holder of `lease` (released or expired), one transition on.
    pub(super) async fn take(&mut self, mut lease: Lease, owner: &str) -> Result<u64> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if holder(spec).is_some_and(|h| h != owner) {
            return Err(unexpected(format!("raw acquire of {name}: held")));
        }
        let transitions = spec.lease_transitions.unwrap_or(0).saturating_add(1);
        let now = micro_now();
        spec.holder_identity = Some(owner.to_owned());
        spec.lease_duration_seconds = Some(secs(BENCH_TTL));
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_transitions = Some(transitions);
        self.put(&name, lease, "raw acquire").await?;
        Ok(u64::try_from(transitions).unwrap_or(0) + 1)
    }

    /// A new object held by `holder` for `ttl`.
    fn new_lease(&self, name: &str, holder: &str, ttl: Duration) -> Lease {
        let now = micro_now();
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([(
                    RUN_LABEL.to_owned(),
                    self.run_id.clone(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(secs(ttl)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn create(&mut self, lease: Lease, what: &'static str) -> Result<()> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let created = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(err(what))?;
        self.cached.insert(name, created);
        Ok(())
    }

    /// client-go's release: holder cleared, `leaseDurationSeconds` 1, count kept.
    async fn release_lease(&mut self, name: &str, mut lease: Lease) -> Result<()> {
        let now = micro_now();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        self.put(name, lease, "raw release").await.map(drop)
    }

    /// A release with a bare `PUT` on the object this client last wrote.
    pub(super) async fn release_cached(&mut self, name: &str) -> Result<()> {
        let lease = self
            .cached
            .get(name)
            .cloned()
            .ok_or_else(|| unexpected(format!("raw release: no object {name} kept")))?;
        self.release_lease(name, lease).await
    }
}

#[async_trait]
impl Client for RawClient {
    async fn acquire(&mut self, role: &str, owner: &str) -> Result<u64> {
        let name = object_name(Kind::Role, role);
        match self.get(&name, "raw read").await? {
            Some(lease) => self.take(lease, owner).await,
            None => {
                let lease = self.new_lease(&name, owner, BENCH_TTL);
                self.create(lease, "raw create").await?;
                Ok(1)
            }
        }
    }

    async fn renew(&mut self, role: &str, owner: &str) -> Result<()> {
        let name = object_name(Kind::Role, role);
        let mut lease = self.current(&name, "raw renewal").await?;
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if holder(spec) != Some(owner) {
            return Err(unexpected(format!("raw renewal of {role}: not held")));
        }
        spec.renew_time = Some(micro_now());
        self.put(&name, lease, "raw renewal").await.map(drop)
    }

    async fn release(&mut self, role: &str, owner: &str, _token: u64) -> Result<()> {
        let name = object_name(Kind::Role, role);
        let lease = self.current(&name, "raw release").await?;
        if lease.spec.as_ref().and_then(holder) != Some(owner) {
            return Err(unexpected(format!("raw release of {role}: not held")));
        }
        self.release_lease(&name, lease).await
    }

    async fn heartbeat(&mut self, node: &str) -> Result<()> {
        let name = object_name(Kind::Member, node);
        match self.get(&name, "raw node read").await? {
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = Some(node.to_owned());
                spec.renew_time = Some(micro_now());
                self.put(&name, lease, "raw heartbeat").await.map(drop)
            }
            None => {
                let lease = self.new_lease(&name, node, REGISTRY_TTL);
                self.create(lease, "raw heartbeat").await
            }
        }
    }
}
