//! What a bench run measures: the store, client counts, durations, trials, TTL.
//!
//! Everything is checked by [`BenchConfig::validate`] before any store, file or server
//! is created, and every message names the command-line flag at fault.

use std::time::Duration;

use crate::BenchError;

/// The most concurrent clients one run accepts.
pub const MAX_CLIENTS: usize = 1024;

/// The default lease TTL of the failover trials on stores that take milliseconds.
pub const DEFAULT_TTL: Duration = Duration::from_millis(300);

/// The default lease TTL of the failover trials on etcd (its minimum).
pub const DEFAULT_ETCD_TTL: Duration = Duration::from_secs(1);

/// The default lease TTL of the failover trials on Kubernetes (`leaseDurationSeconds` is
/// whole seconds, at least one).
pub const DEFAULT_KUBE_TTL: Duration = Duration::from_secs(1);

/// Which store to measure.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// `memory:`: the in-memory store in this process.
    Memory,
    /// `sqlite:PATH`: an existing (or new) file of the user's.
    Sqlite(String),
    /// `sqlite:throwaway`: a file in a temporary directory the run creates and removes.
    SqliteThrowaway,
    /// `postgres://...`: the user's server; bench tables go to schema `tenure_bench`.
    Postgres(String),
    /// `postgres:throwaway`: a server the run starts (with `pg_stat_statements`) and stops.
    PostgresThrowaway,
    /// `etcd://HOST:PORT[/PREFIX]`: the user's cluster; keys go under the URL's prefix
    /// plus `/tenure-bench`.
    Etcd(String),
    /// `etcd:throwaway`: one etcd member the run starts and stops.
    EtcdThrowaway,
    /// `kube:NAMESPACE`: a namespace of the cluster the kubeconfig (or the pod's service
    /// account) reaches; the bench's Lease objects go there.
    Kube(String),
    /// `kube:throwaway`: a kube-apiserver on its own etcd the run starts and stops, used
    /// as the tenant service account (the documented RBAC) in a fresh namespace.
    KubeThrowaway,
}

impl std::fmt::Debug for StoreSpec {
    // The URL may carry a password: only the kind is ever shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

const ACCEPTED: &str = "expected memory:, sqlite:PATH, sqlite:throwaway, postgres://USER@HOST/DB, \
                        postgres:throwaway, etcd://HOST:PORT, etcd:throwaway, kube:NAMESPACE or \
                        kube:throwaway";

impl StoreSpec {
    /// Parses `--store`.
    pub fn parse(raw: &str) -> Result<StoreSpec, BenchError> {
        let raw = raw.trim();
        let Some((scheme, rest)) = raw.split_once(':') else {
            return Err(usage(format!("--store has no scheme; {ACCEPTED}")));
        };
        let spec =
            match (scheme, rest) {
                ("memory", "") => StoreSpec::Memory,
                ("sqlite", "throwaway") => StoreSpec::SqliteThrowaway,
                ("sqlite", path) if !path.is_empty() => StoreSpec::Sqlite(raw.to_owned()),
                ("postgres" | "postgresql", "throwaway") => StoreSpec::PostgresThrowaway,
                ("postgres" | "postgresql", rest) if rest.starts_with("//") => {
                    StoreSpec::Postgres(raw.to_owned())
                }
                ("etcd", "throwaway") => StoreSpec::EtcdThrowaway,
                ("etcd", rest) if rest.starts_with("//") => StoreSpec::Etcd(raw.to_owned()),
                ("kube", "throwaway") => StoreSpec::KubeThrowaway,
                ("kube", "") => return Err(usage(
                    "--store kube: names no namespace; the bench writes Lease objects, so name \
                     the namespace they go to (kube:NAMESPACE, best one of their own) or use \
                     kube:throwaway",
                )),
                ("kube", _) => StoreSpec::Kube(raw.to_owned()),
                _ => {
                    // Nothing of the URL is shown: in a mangled one, even the text before the
                    // first colon may be the password.
                    return Err(usage(format!(
                        "--store: unknown or incomplete store; {ACCEPTED}"
                    )));
                }
            };
        check_server(&spec)?;
        if let StoreSpec::Postgres(url) = &spec {
            // Also keeps sqlx from logging a parameter it does not know, with its value.
            tenure_postgres::connect_options(url).map_err(url_usage)?;
        }
        Ok(spec)
    }

    /// A description without secrets, for headers and messages.
    pub fn describe(&self) -> &'static str {
        match self {
            StoreSpec::Memory => "memory (in-process)",
            StoreSpec::Sqlite(_) => "sqlite (file)",
            StoreSpec::SqliteThrowaway => "sqlite (throwaway file)",
            StoreSpec::Postgres(_) => "postgres (server)",
            StoreSpec::PostgresThrowaway => "postgres (throwaway server)",
            StoreSpec::Etcd(_) => "etcd (cluster)",
            StoreSpec::EtcdThrowaway => "etcd (throwaway member)",
            StoreSpec::Kube(_) => "kubernetes (namespace)",
            StoreSpec::KubeThrowaway => "kubernetes (throwaway API server)",
        }
    }

    fn is_etcd(&self) -> bool {
        matches!(self, StoreSpec::Etcd(_) | StoreSpec::EtcdThrowaway)
    }

    fn is_kube(&self) -> bool {
        matches!(self, StoreSpec::Kube(_) | StoreSpec::KubeThrowaway)
    }

    /// The smallest TTL the store honours, and whether it must be whole seconds.
    pub fn min_ttl(&self) -> (Duration, bool) {
        if self.is_etcd() || self.is_kube() {
            (Duration::from_secs(1), true)
        } else {
            (Duration::from_millis(1), false)
        }
    }

    /// The failover TTL when `--ttl` is not given.
    pub fn default_ttl(&self) -> Duration {
        if self.is_etcd() {
            DEFAULT_ETCD_TTL
        } else if self.is_kube() {
            DEFAULT_KUBE_TTL
        } else {
            DEFAULT_TTL
        }
    }
}

/// A URL the backend's own parser refused, as a usage error naming `--store` (its reason
/// never echoes the URL).
fn url_usage(error: tenure::Error) -> BenchError {
    match error {
        tenure::Error::InvalidArgument { reason, .. } => usage(format!("--store: {reason}")),
        other => usage(format!("--store: {other}")),
    }
}

/// Checks an etcd or Kubernetes store before anything is started: the etcd URL's shape
/// or the namespace's name (the message never echoes the URL), and that this build
/// measures that store at all. Other stores pass.
fn check_server(spec: &StoreSpec) -> Result<(), BenchError> {
    match spec {
        #[cfg(feature = "etcd")]
        StoreSpec::Etcd(url) => tenure_etcd::EtcdUrl::parse(url)
            .map(drop)
            .map_err(url_usage),
        #[cfg(feature = "kube")]
        StoreSpec::Kube(url) => tenure_kube::KubeUrl::parse(url)
            .map(drop)
            .map_err(url_usage),
        #[cfg(not(feature = "etcd"))]
        StoreSpec::Etcd(_) | StoreSpec::EtcdThrowaway => Err(usage(crate::ETCD_NOT_BUILT)),
        #[cfg(not(feature = "kube"))]
        StoreSpec::Kube(_) | StoreSpec::KubeThrowaway => Err(usage(crate::KUBE_NOT_BUILT)),
        _ => Ok(()),
    }
}

/// One bench run's settings.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The store.
    pub store: StoreSpec,
    /// Client counts to measure at (tokio tasks in this process), in order.
    pub clients: Vec<usize>,
    /// Measuring time per operation and client count (store and raw rounds together;
    /// acquire and release share theirs).
    pub duration: Duration,
    /// How many roles the renewing clients spread over; `None`: one per client.
    pub roles: Option<usize>,
    /// Failover trials of each kind.
    pub trials: usize,
    /// Failover lease TTL; `None`: the store's default ([`StoreSpec::default_ttl`]).
    pub ttl: Option<Duration>,
}

impl BenchConfig {
    /// Defaults for `store`: clients 1 and 16, 3 s per cell, 100 trials.
    pub fn new(store: StoreSpec) -> BenchConfig {
        BenchConfig {
            store,
            clients: vec![1, 16],
            duration: Duration::from_secs(3),
            roles: None,
            trials: 100,
            ttl: None,
        }
    }

    /// The failover TTL in effect.
    pub fn ttl(&self) -> Duration {
        self.ttl.unwrap_or_else(|| self.store.default_ttl())
    }

    /// Checks every setting; the error names the flag.
    pub fn validate(&self) -> Result<(), BenchError> {
        if self.clients.is_empty() {
            return Err(usage("--clients needs at least one client count"));
        }
        if let Some(&bad) = self.clients.iter().find(|&&n| n == 0 || n > MAX_CLIENTS) {
            return Err(usage(format!(
                "--clients {bad}: each count must be 1 to {MAX_CLIENTS}"
            )));
        }
        if self.duration < Duration::from_millis(10) {
            return Err(usage(format!(
                "--duration {:?} is too short: at least 10ms per operation",
                self.duration
            )));
        }
        if self.roles == Some(0) {
            return Err(usage("--roles must be at least 1"));
        }
        if self.trials == 0 {
            return Err(usage("--trials must be at least 1"));
        }
        let ttl = self.ttl();
        let (min, whole_seconds) = self.store.min_ttl();
        if ttl < min {
            return Err(usage(format!(
                "--ttl {ttl:?} is below the store's minimum of {min:?}"
            )));
        }
        if whole_seconds && ttl.subsec_nanos() != 0 {
            return Err(usage(format!(
                "--ttl {ttl:?}: this store takes whole seconds"
            )));
        }
        Ok(())
    }

    /// Interleaved rounds per cell: about one per 250 ms, 2 to 20.
    pub fn rounds(&self) -> usize {
        ((self.duration.as_millis() / 250) as usize).clamp(2, 20)
    }

    /// The length of one variant's turn in a round.
    pub fn slice(&self) -> Duration {
        self.duration / (2 * self.rounds() as u32)
    }
}

/// Parses `--clients`: positive integers separated by commas (`1,16`).
pub fn parse_clients(raw: &str) -> Result<Vec<usize>, BenchError> {
    let mut counts = Vec::new();
    for part in raw.split(',').map(str::trim) {
        match part.parse::<usize>() {
            Ok(n) if (1..=MAX_CLIENTS).contains(&n) => {
                if !counts.contains(&n) {
                    counts.push(n);
                }
            }
            _ => {
                let shown: String = part.chars().take(20).collect();
                return Err(usage(format!(
                    "--clients {shown:?} is not a client count: expected integers from 1 to \
                     {MAX_CLIENTS} separated by commas, e.g. 1,16"
                )));
            }
        }
    }
    Ok(counts)
}

fn usage(message: impl Into<String>) -> BenchError {
    BenchError::Usage(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_message(result: Result<impl std::fmt::Debug, BenchError>) -> String {
        match result {
            Err(BenchError::Usage(message)) => message,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn client_lists() {
        assert_eq!(parse_clients("1,16").unwrap(), [1, 16]);
        assert_eq!(parse_clients(" 4 , 2,4").unwrap(), [4, 2]);
        for bad in ["0", "x", "1,,2", "", "-1", "1025", "1.5"] {
            assert!(
                usage_message(parse_clients(bad)).contains("--clients"),
                "{bad}"
            );
        }
    }

    #[test]
    fn stores() {
        #[cfg_attr(not(any(feature = "etcd", feature = "kube")), allow(unused_mut))]
        let mut good = vec![
            ("memory:", StoreSpec::Memory),
            ("sqlite:throwaway", StoreSpec::SqliteThrowaway),
            (
                "sqlite:/tmp/x.db",
                StoreSpec::Sqlite("sqlite:/tmp/x.db".into()),
            ),
            ("postgresql:throwaway", StoreSpec::PostgresThrowaway),
        ];
        #[cfg(feature = "etcd")]
        good.push(("etcd:throwaway", StoreSpec::EtcdThrowaway));
        #[cfg(feature = "kube")]
        good.extend([
            ("kube:throwaway", StoreSpec::KubeThrowaway),
            ("kube:team-a", StoreSpec::Kube("kube:team-a".into())),
        ]);
        for (raw, want) in good {
            assert_eq!(StoreSpec::parse(raw).unwrap(), want, "{raw}");
        }
        assert!(matches!(
            StoreSpec::parse("postgres://u:secret@h/db").unwrap(),
            StoreSpec::Postgres(_)
        ));
        #[cfg_attr(not(feature = "etcd"), allow(unused_mut))]
        let mut bad = vec![
            "",
            "memory",
            "redis://h",
            "sqlite:",
            "postgres:h",
            "mysql://u:pw@h",
        ];
        // With etcd built in, etcd URLs are checked when parsed.
        #[cfg(feature = "etcd")]
        bad.extend(["etcd://u:pw@h:1", "etcd://h", "etcd://h:1/p/"]);
        for bad in bad {
            let message = usage_message(StoreSpec::parse(bad));
            assert!(message.contains("--store"), "{bad}: {message}");
            assert!(!message.contains("pw"), "{message}");
        }
        #[cfg(not(feature = "etcd"))]
        assert!(usage_message(StoreSpec::parse("etcd:throwaway")).contains("--features etcd"));
        #[cfg(feature = "etcd")]
        assert!(matches!(
            StoreSpec::parse("etcd://127.0.0.1:2379/app").unwrap(),
            StoreSpec::Etcd(_)
        ));
        #[cfg(not(feature = "kube"))]
        assert!(usage_message(StoreSpec::parse("kube:throwaway")).contains("--features kube"));
        #[cfg(feature = "kube")]
        {
            for bad in ["kube:Team", "kube:a_b", "kube://h:6443"] {
                let message = usage_message(StoreSpec::parse(bad));
                assert!(message.contains("--store"), "{bad}: {message}");
            }
        }
        // Never the namespace the kubeconfig happens to point at.
        assert!(usage_message(StoreSpec::parse("kube:")).contains("kube:NAMESPACE"));
        // Debug never shows the URL.
        let spec = StoreSpec::Postgres("postgres://u:secret@h/db".into());
        assert!(!format!("{spec:?}").contains("secret"));
    }

    #[test]
    fn settings_are_checked_with_the_flag_named() {
        let ok = BenchConfig::new(StoreSpec::Memory);
        ok.validate().unwrap();
        assert_eq!(ok.ttl(), DEFAULT_TTL);
        type Break = fn(&mut BenchConfig);
        let cases: [(&str, Break); 6] = [
            ("--clients", |c| c.clients = vec![]),
            ("--clients", |c| c.clients = vec![1, 0]),
            ("--duration", |c| c.duration = Duration::ZERO),
            ("--roles", |c| c.roles = Some(0)),
            ("--trials", |c| c.trials = 0),
            ("--ttl", |c| c.ttl = Some(Duration::from_micros(10))),
        ];
        for (flag, break_it) in cases {
            let mut config = ok.clone();
            break_it(&mut config);
            assert!(usage_message(config.validate()).contains(flag), "{flag}");
        }
        let mut etcd = BenchConfig::new(StoreSpec::EtcdThrowaway);
        assert_eq!(etcd.ttl(), Duration::from_secs(1));
        etcd.ttl = Some(Duration::from_millis(300));
        assert!(usage_message(etcd.validate()).contains("minimum"));
        etcd.ttl = Some(Duration::from_millis(1500));
        assert!(usage_message(etcd.validate()).contains("whole seconds"));
        let mut kube = BenchConfig::new(StoreSpec::KubeThrowaway);
        assert_eq!(kube.ttl(), Duration::from_secs(1));
        kube.ttl = Some(Duration::from_millis(2500));
        assert!(usage_message(kube.validate()).contains("whole seconds"));
    }

    #[test]
    fn rounds_follow_the_duration() {
        let mut config = BenchConfig::new(StoreSpec::Memory);
        assert_eq!(config.rounds(), 12);
        assert_eq!(config.slice(), Duration::from_millis(125));
        config.duration = Duration::from_millis(50);
        assert_eq!(config.rounds(), 2);
        config.duration = Duration::from_secs(60);
        assert_eq!(config.rounds(), 20);
    }
}
