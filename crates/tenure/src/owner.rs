//! Owner ids: one per process incarnation.
//!
//! The store tells owners apart by their id alone: a call from an owner id that holds a
//! live lease renews it. Two processes sharing an id would both "hold" the lease under one
//! token, so an id must name one process incarnation. A caller picks a readable label (a
//! host name, a job name); [`owner_id_with_label`] appends the process id and a random
//! suffix, so a restarted process, or a second process with the same label, is a new owner.

use rand::Rng;

use crate::lease::{validate_name, MAX_NAME_LEN};
use crate::{Error, Result};

/// The longest suffix [`owner_id_with_label`] appends: `-`, a process id (at most 10
/// digits), `-`, 16 hex digits.
const MAX_SUFFIX_LEN: usize = 1 + 10 + 1 + 16;

/// The longest label [`owner_id_with_label`] accepts, leaving room for the suffix within
/// [`MAX_NAME_LEN`].
pub const MAX_OWNER_LABEL_LEN: usize = MAX_NAME_LEN - MAX_SUFFIX_LEN;

/// `LABEL-PID-RANDOM`: an owner id for this process incarnation that starts with `label`.
///
/// Two calls return different ids (64 random bits apart), in one process or in two, so
/// contenders given the same label are distinct owners and never share a term.
///
/// The label follows the rules of every name (non-empty, no NUL or control characters)
/// and is at most [`MAX_OWNER_LABEL_LEN`] bytes; otherwise the error is
/// [`Error::InvalidArgument`] for the field `owner_label`.
///
/// ```
/// let a = tenure::owner_id_with_label("cronhost")?;
/// let b = tenure::owner_id_with_label("cronhost")?;
/// assert!(a.starts_with("cronhost-"));
/// assert_ne!(a, b);
/// # Ok::<(), tenure::Error>(())
/// ```
pub fn owner_id_with_label(label: &str) -> Result<String> {
    validate_name("owner_label", label)?;
    if label.len() > MAX_OWNER_LABEL_LEN {
        return Err(Error::invalid(
            "owner_label",
            format!(
                "is {} bytes long, at most {MAX_OWNER_LABEL_LEN} allowed \
                 (a per-process suffix is appended)",
                label.len()
            ),
        ));
    }
    Ok(with_suffix(label))
}

/// The default owner id: this host's name as the label (`localhost` if the name is not a
/// usable label).
pub(crate) fn host_owner_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    owner_id_with_label(&host).unwrap_or_else(|_| with_suffix("localhost"))
}

fn with_suffix(label: &str) -> String {
    format!(
        "{label}-{}-{:016x}",
        std::process::id(),
        rand::rng().random::<u64>()
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{InMemoryLeaseStore, LeaseLeaderElector, LeaseLeaderOptions, TokioClock};

    #[test]
    fn ids_are_the_label_and_a_unique_suffix() {
        let a = owner_id_with_label("cronhost").unwrap();
        let b = owner_id_with_label("cronhost").unwrap();
        assert_ne!(a, b);
        let pid = std::process::id().to_string();
        for id in [&a, &b] {
            let parts: Vec<&str> = id.rsplitn(3, '-').collect();
            assert_eq!(parts.len(), 3, "{id}");
            assert_eq!(parts[2], "cronhost");
            assert_eq!(parts[1], pid);
            assert_eq!(parts[0].len(), 16, "{id}");
        }
        assert!(host_owner_id().len() <= MAX_NAME_LEN);
    }

    #[test]
    fn bad_labels_are_refused_naming_the_label() {
        let longest = "l".repeat(MAX_OWNER_LABEL_LEN);
        let id = owner_id_with_label(&longest).unwrap();
        assert!(validate_name("owner_id", &id).is_ok());
        assert!(id.len() <= MAX_OWNER_LABEL_LEN + MAX_SUFFIX_LEN);
        for bad in [
            String::new(),
            "a\0b".to_owned(),
            "a\nb".to_owned(),
            "l".repeat(MAX_OWNER_LABEL_LEN + 1),
        ] {
            match owner_id_with_label(&bad) {
                Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "owner_label"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    /// Two electors whose owner ids come from one label, over one store: their work never
    /// runs at the same time, and each term has its own token.
    #[tokio::test(start_paused = true)]
    async fn electors_with_one_label_never_overlap() {
        let store = Arc::new(InMemoryLeaseStore::with_clock(TokioClock::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tokens = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let electors: Vec<_> = (0..2)
            .map(|_| {
                let options = LeaseLeaderOptions {
                    owner_id: owner_id_with_label("cronhost").unwrap(),
                    lease_ttl: Duration::from_secs(3),
                    renew_interval: Duration::from_secs(1),
                    retry_interval: Duration::from_millis(200),
                    ..Default::default()
                };
                LeaseLeaderElector::new(store.clone(), options).unwrap()
            })
            .collect();
        let runs = electors.into_iter().map(|elector| {
            let (running, most, tokens) = (running.clone(), most.clone(), tokens.clone());
            tokio::spawn(async move {
                elector
                    .run(
                        "label",
                        move |token, _leadership| {
                            let (running, most, tokens) =
                                (running.clone(), most.clone(), tokens.clone());
                            async move {
                                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                tokens.lock().push(token.get());
                                // Long enough for the other elector to try many times.
                                tokio::time::sleep(Duration::from_secs(10)).await;
                                running.fetch_sub(1, Ordering::SeqCst);
                                Ok::<(), Error>(())
                            }
                        },
                        CancellationToken::new(),
                    )
                    .await
            })
        });
        for run in runs.collect::<Vec<_>>() {
            run.await.unwrap().unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "both electors ran work at once"
        );
        assert_eq!(*tokens.lock(), [1, 2]);
    }
}
