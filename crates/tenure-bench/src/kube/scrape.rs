//! The API server's own request counters: `apiserver_request_total` of `leases` in
//! `coordination.k8s.io`, read from Prometheus text.

use std::collections::BTreeMap;

/// Lease requests by verb and status code, as one read of `/metrics` gave them.
#[derive(Clone, Default)]
pub(super) struct Scrape {
    pub(super) counts: BTreeMap<(String, String), u64>,
}

impl Scrape {
    /// Reads `apiserver_request_total` of `leases` in `coordination.k8s.io` from
    /// Prometheus text.
    pub(super) fn parse(body: &str) -> Scrape {
        let mut counts = BTreeMap::new();
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            if label(labels, "resource") != Some("leases")
                || label(labels, "group") != Some("coordination.k8s.io")
            {
                continue;
            }
            let (Some(verb), Some(code)) = (label(labels, "verb"), label(labels, "code")) else {
                continue;
            };
            // Counters are printed as floats (`1.234567e+06` past a million).
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            *counts
                .entry((verb.to_owned(), code.to_owned()))
                .or_insert(0) += value.round() as u64;
        }
        Scrape { counts }
    }

    /// Every request but watches (a watch is counted when it ends, however long it ran).
    pub(super) fn requests(&self) -> u64 {
        self.counts
            .iter()
            .filter(|((verb, _), _)| verb != "WATCH")
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes that succeeded: objects created, replaced, patched or deleted.
    pub(super) fn writes(&self) -> u64 {
        self.counts
            .iter()
            .filter(|((verb, code), _)| {
                matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
                    && code.starts_with('2')
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// What was added since `earlier`, by verb and code, for the debug log.
    pub(super) fn added_since(&self, earlier: &Scrape) -> String {
        let added: Vec<String> = self
            .counts
            .iter()
            .filter_map(|((verb, code), &n)| {
                let key = (verb.clone(), code.clone());
                let delta = n.saturating_sub(earlier.counts.get(&key).copied().unwrap_or(0));
                (delta > 0).then(|| format!("{verb} {code} +{delta}"))
            })
            .collect();
        added.join(", ")
    }
}

/// The value of `key` in a Prometheus label set (`a="1",b="2"`; no value here holds a
/// comma or a quote).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        pair.strip_prefix(key)?
            .strip_prefix("=\"")?
            .strip_suffix('"')
    })
}
