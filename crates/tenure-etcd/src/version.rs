//! etcd server versions, and which of them answer keep-alives safely.
//!
//! etcd releases before the fix of its issue 14758 can answer a keep-alive with a
//! positive TTL for a lease that is being revoked at that moment: the revocation has
//! already deleted the lease's keys (here: the term's key), yet the holder is told it has
//! a whole TTL left. A renewal that trusted that answer would keep a term alive locally
//! while another owner acquires the role. The fix shipped in 3.4.38, 3.5.23 and 3.6.5
//! (and every later 3.7+ release).
//!
//! Against an older or unknown server, [`EtcdLeaseStore`](crate::EtcdLeaseStore) sends a
//! renewal's keep-alive first and its transaction (which checks that the term's key
//! still exists) only after the keep-alive answered, so a key deleted by such a
//! revocation fails the transaction. Against a fixed server both go out together, and a
//! renewal costs one round trip instead of two.

use std::fmt;

/// The first release of each line whose keep-alive answers are safe.
pub const SAFE_KEEP_ALIVE_SINCE: [EtcdVersion; 3] = [
    EtcdVersion::new(3, 4, 38),
    EtcdVersion::new(3, 5, 23),
    EtcdVersion::new(3, 6, 5),
];

/// An etcd server version, `major.minor.patch`, as its status call reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    /// Major version (3 for every etcd with the v3 API).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl EtcdVersion {
    /// The version `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        EtcdVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parses `3.5.9`, also with a pre-release or build suffix (`3.6.0-rc.1`, taken as
    /// `3.6.0`); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let core = text
            .trim()
            .trim_start_matches('v')
            .split(['-', '+'])
            .next()?;
        let mut parts = core.split('.');
        let mut number = || parts.next()?.parse::<u32>().ok();
        let version = EtcdVersion::new(number()?, number()?, number()?);
        parts.next().is_none().then_some(version)
    }

    /// Whether this release answers keep-alives safely (see the module docs).
    pub fn keep_alive_is_safe(&self) -> bool {
        match SAFE_KEEP_ALIVE_SINCE
            .iter()
            .find(|fixed| (fixed.major, fixed.minor) == (self.major, self.minor))
        {
            Some(fixed) => self >= fixed,
            None => *self > SAFE_KEEP_ALIVE_SINCE[SAFE_KEEP_ALIVE_SINCE.len() - 1],
        }
    }
}

/// Whether a store must send a keep-alive before the transaction that depends on it,
/// against a server that reported `version` (`None`: unknown, so yes).
pub fn keep_alive_first(version: Option<EtcdVersion>) -> bool {
    !version.is_some_and(|v| v.keep_alive_is_safe())
}

/// The releases of [`SAFE_KEEP_ALIVE_SINCE`], as text for messages: `3.4.38, 3.5.23, 3.6.5`.
pub fn safe_releases() -> String {
    SAFE_KEEP_ALIVE_SINCE
        .iter()
        .map(EtcdVersion::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_and_pre_release_versions() {
        assert_eq!(
            EtcdVersion::parse("3.4.23"),
            Some(EtcdVersion::new(3, 4, 23))
        );
        assert_eq!(
            EtcdVersion::parse("v3.6.0-rc.1"),
            Some(EtcdVersion::new(3, 6, 0))
        );
        assert_eq!(
            EtcdVersion::parse("3.5.9+git"),
            Some(EtcdVersion::new(3, 5, 9))
        );
        for bad in [
            "",
            "3",
            "3.4",
            "3.4.x",
            "3.4.1.2",
            "not a version",
            "-1.0.0",
        ] {
            assert_eq!(EtcdVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn knows_which_releases_answer_keep_alives_safely() {
        assert_eq!(safe_releases(), "3.4.38, 3.5.23, 3.6.5");
        assert!(
            keep_alive_first(None),
            "an unknown server is treated as unsafe"
        );
        let safe = |v: &str| EtcdVersion::parse(v).unwrap().keep_alive_is_safe();
        for unsafe_version in ["3.3.27", "3.4.23", "3.4.37", "3.5.0", "3.5.22", "3.6.4"] {
            assert!(!safe(unsafe_version), "{unsafe_version}");
        }
        for safe_version in [
            "3.4.38", "3.4.44", "3.5.23", "3.5.30", "3.6.5", "3.7.0", "4.0.0",
        ] {
            assert!(safe(safe_version), "{safe_version}");
        }
    }
}
