//! `etcd://host:port[,host:port...][/prefix]` URLs, for the CLI and for quick setups.
//!
//! The host list names the cluster's client endpoints (plain HTTP; IPv6 hosts in
//! brackets); the path, if any, is the key prefix (default [`DEFAULT_PREFIX`]). Errors
//! never echo the URL: at most they name one `host:port`.

use std::net::Ipv6Addr;
use std::str::FromStr;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tenure::{Error, Result};

use crate::conn::BACKEND;
use crate::schema::{validate_prefix, DEFAULT_PREFIX};
use crate::version::EtcdVersion;
use crate::EtcdLeaseStore;

const SCHEME: &str = "etcd://";
const SHAPE: &str = "expected etcd://host:port[,host:port...][/prefix]";
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A parsed `etcd://` URL: endpoints and key prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdUrl {
    endpoints: Vec<String>,
    prefix: String,
}

impl EtcdUrl {
    /// Parses `etcd://host:port[,host:port...][/prefix]`. Anything else is
    /// `InvalidArgument` naming `url` (or `prefix`), with a message that says what was
    /// expected.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .get(..SCHEME.len())
            .filter(|scheme| scheme.eq_ignore_ascii_case(SCHEME))
            .map(|_| &url[SCHEME.len()..])
            .ok_or_else(|| Error::invalid("url", format!("must start with etcd://; {SHAPE}")))?;
        if rest.contains(['?', '#']) {
            return Err(Error::invalid(
                "url",
                format!("query strings and fragments are not supported; {SHAPE}"),
            ));
        }
        let (hosts, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        if hosts.contains('@') {
            return Err(Error::invalid(
                "url",
                "credentials in etcd URLs are not supported; connect an etcd_client::Client \
                 with ConnectOptions::with_user and use EtcdLeaseStore::new",
            ));
        }
        if hosts.is_empty() {
            return Err(Error::invalid("url", format!("names no endpoint; {SHAPE}")));
        }
        let endpoints = hosts
            .split(',')
            .enumerate()
            .map(|(i, host)| parse_endpoint(i + 1, host))
            .collect::<Result<Vec<_>>>()?;
        let prefix = match path {
            "" | "/" => DEFAULT_PREFIX.to_owned(),
            path => {
                validate_prefix(path)?;
                path.to_owned()
            }
        };
        Ok(EtcdUrl { endpoints, prefix })
    }

    /// The client endpoints, `http://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix (the URL's path, or [`DEFAULT_PREFIX`]).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl FromStr for EtcdUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        EtcdUrl::parse(url)
    }
}

fn parse_endpoint(index: usize, host_port: &str) -> Result<String> {
    let bad = |what: &str| {
        Error::invalid(
            "url",
            format!("endpoint {index} {what}; each endpoint is host:port, {SHAPE}"),
        )
    };
    if host_port.is_empty() {
        return Err(bad("is empty"));
    }
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| bad("has an unclosed '['"))?;
        let port = after.strip_prefix(':').ok_or_else(|| bad("has no port"))?;
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(bad("has a bracketed host that is not an IPv6 address"));
        }
        (format!("[{host}]"), port)
    } else {
        let (host, port) = host_port
            .rsplit_once(':')
            .ok_or_else(|| bad("has no port"))?;
        if host.contains(':') {
            return Err(bad("is an IPv6 address without brackets"));
        }
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        // What the gRPC client takes as a URI host (an IPv4 address is such a name too):
        // anything else would pass here and fail later as an unreachable store.
        if !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(bad(
                "has a host with characters other than ASCII letters, digits, '-', '.' and '_'",
            ));
        }
        (host.to_owned(), port)
    };
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad("has a port that is not a number from 1 to 65535")),
        Ok(port) => Ok(format!("http://{host}:{port}")),
    }
}

/// The options [`connect_client`] uses: require a leader (a member cut off from the
/// quorum answers at once instead of hanging), connect within 3 s, and HTTP/2
/// keep-alive pings so a dead connection is noticed within seconds.
pub fn connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_require_leader(true)
        .with_connect_timeout(PROBE_TIMEOUT)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
}

/// Connects an etcd client to the URL's endpoints, after checking that at least one
/// answers. When none does, the error names each endpoint and why.
///
/// Also returns the oldest server version the reachable endpoints reported (`None` when
/// one reported a version that does not parse), for
/// [`EtcdLeaseStore::for_server`](crate::EtcdLeaseStore::for_server). An endpoint running
/// a release whose keep-alive answers are unsafe (see [`crate::version`]) is logged as a
/// warning.
pub async fn connect_client(url: &EtcdUrl) -> Result<(Client, Option<EtcdVersion>)> {
    let mut failures = Vec::new();
    let mut versions = Vec::new();
    for endpoint in &url.endpoints {
        let host = endpoint.trim_start_matches("http://");
        match probe(endpoint).await {
            Ok(reported) => {
                let version = EtcdVersion::parse(&reported);
                if crate::version::keep_alive_first(version) {
                    tracing::warn!(
                        endpoint = host,
                        version = %reported,
                        safe_since = %crate::version::safe_releases(),
                        "this etcd release may answer a keep-alive for a lease it is revoking; \
                         renewals wait for the keep-alive before their transaction (one more \
                         round trip); upgrade etcd to avoid it"
                    );
                }
                versions.push(version);
            }
            Err(reason) => {
                tracing::warn!(endpoint = host, reason = %reason, "etcd endpoint unreachable");
                failures.push(format!("{host} ({reason})"));
            }
        }
    }
    if versions.is_empty() {
        return Err(Error::store_msg(
            BACKEND,
            format!(
                "no etcd endpoint reachable: {}; check that etcd runs and listens there",
                failures.join(", ")
            ),
        ));
    }
    let oldest = versions.iter().copied().min().flatten();
    let client = Client::connect(&url.endpoints, Some(connect_options()))
        .await
        .map_err(|e| Error::store(BACKEND, "connecting to etcd", e))?;
    Ok((client, oldest))
}

/// One status call to one endpoint, within [`PROBE_TIMEOUT`]; returns the version it
/// reports.
async fn probe(endpoint: &str) -> std::result::Result<String, String> {
    let attempt = async {
        let mut client = Client::connect([endpoint], Some(connect_options())).await?;
        client
            .status()
            .await
            .map(|status| status.version().to_owned())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(version)) => Ok(version),
        Ok(Err(error)) => Err(short_reason(&error)),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

fn short_reason(error: &etcd_client::Error) -> String {
    // The innermost cause says it best ("Connection refused (os error 111)").
    let mut reason = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        reason = cause.to_string();
        source = cause.source();
    }
    reason
}

/// Parses an `etcd://` URL, connects (see [`connect_client`]) and returns a lease store
/// on the URL's prefix. Build a registry on the same connection with
/// [`EtcdLeaseStore::registry`]`(ttl)`: it counts the store's session keep-alives as
/// heartbeats.
pub async fn connect(url: &str) -> Result<EtcdLeaseStore> {
    let url = EtcdUrl::parse(url)?;
    let (client, version) = connect_client(&url).await?;
    Ok(EtcdLeaseStore::new(client, url.prefix())?.for_server(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(url: &str) -> String {
        match EtcdUrl::parse(url) {
            Err(Error::InvalidArgument { reason, .. }) => reason,
            other => panic!("{url}: expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn parses_hosts_and_prefix() {
        let url = EtcdUrl::parse("etcd://a:2379,b:2380/myapp/x").unwrap();
        assert_eq!(url.endpoints(), ["http://a:2379", "http://b:2380"]);
        assert_eq!(url.prefix(), "/myapp/x");
        let url = EtcdUrl::parse("ETCD://127.0.0.1:1").unwrap();
        assert_eq!(url.prefix(), DEFAULT_PREFIX);
        let url: EtcdUrl = "etcd://[::1]:2379/".parse().unwrap();
        assert_eq!(url.endpoints(), ["http://[::1]:2379"]);
        assert_eq!(url.prefix(), DEFAULT_PREFIX);
    }

    #[test]
    fn rejects_malformed_urls_without_echoing_them() {
        for url in [
            "http://a:1",
            "etcd://",
            "etcd:///p",
            "etcd://a",
            "etcd://a:0",
            "etcd://a:99999",
            "etcd://a:1,,b:2",
            "etcd://::1:2379",
            "etcd://[::1:2379",
            "etcd://a:1/p/",
            "etcd://a:1/p q",
            "etcd://a:1?x=1",
            "etcd://user:secret@a:1",
        ] {
            let reason = invalid(url);
            assert!(!reason.contains("secret"), "{reason}");
            assert!(reason.len() > 10, "{reason}");
        }
    }
}
