//! [`KubeFence`]: a fence kept in the API server, for `tenure fence` and side effects
//! outside Kubernetes.
//!
//! Each resource is one Lease object (`tenure.fence-RESOURCE`, no holder) whose
//! `tenure.dev/highest-token` annotation is the highest token admitted. Admitting a
//! higher token is a write conditional on the version read, so two writers cannot both
//! move it, and a lower token is refused without a write.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use tenure::lease::validate_name;
use tenure::{Error, FenceStore, FencingToken, Result};

use crate::conn::{api_error, is_conflict, KubeConnection};
use crate::names::{object_name, Kind};
use crate::record::{annotate, corrupt, new_object, Record, HIGHEST};

const ATTEMPTS: usize = 32;

/// A fence whose highest admitted token per resource lives in a Lease object.
pub struct KubeFence {
    conn: KubeConnection,
    api: Api<Lease>,
}

impl std::fmt::Debug for KubeFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeFence")
            .field("namespace", &self.conn.namespace)
            .finish_non_exhaustive()
    }
}

impl KubeFence {
    /// A fence on the connection's namespace.
    pub fn new(conn: KubeConnection) -> KubeFence {
        let api = conn.leases();
        KubeFence { conn, api }
    }

    async fn read(&self, resource: &str) -> Result<Option<(Record, FencingToken)>> {
        let object = object_name(Kind::Fence, resource);
        let lease = self
            .api
            .get_opt(&object)
            .await
            .map_err(|error| api_error(&self.conn.namespace, "get", &object, error))?;
        let Some(lease) = lease else {
            return Ok(None);
        };
        let record = Record::read(lease, resource)?;
        let raw = record.annotations.get(HIGHEST);
        let highest = raw
            .and_then(|raw| raw.parse::<u64>().ok())
            .ok_or_else(|| corrupt(format!("{object} has {HIGHEST} {raw:?}")))?;
        Ok(Some((record, FencingToken::from(highest))))
    }
}

#[async_trait::async_trait]
impl FenceStore for KubeFence {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        validate_name("resource", resource)?;
        let object = object_name(Kind::Fence, resource);
        for _ in 0..ATTEMPTS {
            let written = match self.read(resource).await? {
                Some((_, highest)) if token < highest => {
                    return Err(Error::Fenced {
                        presented: token,
                        highest,
                    })
                }
                Some((_, highest)) if token == highest => return Ok(()),
                Some((record, _)) => {
                    let mut lease = record.to_write();
                    annotate(&mut lease, HIGHEST, Some(token.get().to_string()));
                    self.api
                        .replace(&object, &PostParams::default(), &lease)
                        .await
                }
                None => {
                    let mut lease = new_object(&object, Kind::Fence.label(), Some(resource));
                    annotate(&mut lease, HIGHEST, Some(token.get().to_string()));
                    self.api.create(&PostParams::default(), &lease).await
                }
            };
            match written {
                Ok(_) => return Ok(()),
                Err(error) if is_conflict(&error) => continue,
                Err(error) => {
                    return Err(api_error(&self.conn.namespace, "update", &object, error))
                }
            }
        }
        Err(Error::store_msg(
            crate::BACKEND,
            format!("fence {resource:?}: lost {ATTEMPTS} conditional writes in a row"),
        ))
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        validate_name("resource", resource)?;
        Ok(self.read(resource).await?.map(|(_, highest)| highest))
    }
}
