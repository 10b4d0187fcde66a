//! Object names: which Lease object holds a role, a member, a session or a fence.
//!
//! Kubernetes object names are DNS subdomains: at most 253 characters of `[a-z0-9.-]`,
//! each dot-separated label starting and ending with a letter or digit. tenure's names
//! are any UTF-8 up to 255 bytes, so they are escaped, injectively:
//!
//! - a byte in `[a-z0-9]` stands for itself;
//! - any other byte (upper case, `-`, `.`, `/`, UTF-8 continuation bytes...) is written
//!   `-xx`, its two lower-case hex digits.
//!
//! `-` only ever starts an escape, so the code is prefix-free and decodes uniquely, and
//! its output has no dot and ends with a letter or digit. Each kind of object puts its
//! own prefix before it: role `G/k` is `tenure--47-2fk`, member `web-1` is
//! `tenure.member-web-2d1`, fence `ledger` is `tenure.fence-ledger`, session 0x1f is
//! `tenure.session-1f`, and the epoch counter is `tenure.epochs`. Role names have no dot
//! after `tenure`, every other kind has one, so no two kinds share a name.
//!
//! A candidacy (an owner queued for a role, see `lease::queue`) is named by both:
//! `tenure.candidate-<role>.by-<owner>`, each escaped as above, so `node-b` queued for
//! `G/k` is `tenure.candidate--47-2fk.by-node-2db`. An escape has no dot, so the two
//! parts split apart again at the one dot between them; `by-` keeps the last label
//! starting with a letter even when the owner's escape starts with `-`.
//!
//! A name whose escape would pass 253 characters is hashed instead:
//! `tenure.h<kind>.<sha-256 of the name, 64 hex digits>` (`r` role, `m` member, `f`
//! fence; `c` a candidacy, hashing the role, a NUL byte and the owner, which no name
//! contains). Every object also carries its name in an annotation, checked on every
//! read, so even a hash collision would be an error, never two roles sharing one lease
//! (a candidacy's owner is its `holderIdentity`, checked the same way).

use sha2::{Digest, Sha256};

/// The longest Kubernetes object name.
pub const MAX_OBJECT_NAME: usize = 253;

/// The name of the namespace-wide epoch counter.
pub const EPOCHS: &str = "tenure.epochs";

/// What an object is for; each kind has its own name prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A role's lease.
    Role,
    /// A member's heartbeat.
    Member,
    /// A fence's highest admitted token.
    Fence,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Role => "tenure-",
            Kind::Member => "tenure.member-",
            Kind::Fence => "tenure.fence-",
        }
    }

    fn hash_prefix(self) -> &'static str {
        match self {
            Kind::Role => "tenure.hr.",
            Kind::Member => "tenure.hm.",
            Kind::Fence => "tenure.hf.",
        }
    }

    /// The `tenure.dev/kind` label value.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Role => "role",
            Kind::Member => "member",
            Kind::Fence => "fence",
        }
    }
}

/// The object name of `name` (a role, node id or fence resource).
pub fn object_name(kind: Kind, name: &str) -> String {
    let mut out = String::with_capacity(kind.prefix().len() + name.len());
    out.push_str(kind.prefix());
    escape_into(name, &mut out);
    if out.len() <= MAX_OBJECT_NAME {
        return out;
    }
    let digest = Sha256::digest(name.as_bytes());
    hex_into(&digest, String::from(kind.hash_prefix()))
}

/// The object name of a session.
pub fn session_name(id: u64) -> String {
    format!("tenure.session-{id:x}")
}

/// The `tenure.dev/kind` label value of a candidacy.
pub const CANDIDATE: &str = "candidate";

/// The object name of `owner`'s candidacy for `role`.
pub fn candidacy_name(role: &str, owner: &str) -> String {
    let mut out = String::from("tenure.candidate-");
    escape_into(role, &mut out);
    out.push_str(".by-");
    escape_into(owner, &mut out);
    if out.len() <= MAX_OBJECT_NAME {
        return out;
    }
    let mut hasher = Sha256::new();
    hasher.update(role.as_bytes());
    hasher.update([0]);
    hasher.update(owner.as_bytes());
    hex_into(&hasher.finalize(), String::from("tenure.hc."))
}

/// The `tenure.dev/role` label of a role's candidacies: the first 16 bytes of the
/// role's SHA-256 in hex (a label value holds at most 63 characters of a few kinds, a
/// role name any UTF-8). Only narrows a list; a candidacy's role is read from its
/// annotation.
pub fn role_label(role: &str) -> String {
    let digest = Sha256::digest(role.as_bytes());
    hex_into(&digest[..16], String::new())
}

fn hex_into(bytes: &[u8], mut out: String) -> String {
    for byte in bytes {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn escape_into(name: &str, out: &mut String) {
    for byte in name.bytes() {
        if byte.is_ascii_lowercase() || byte.is_ascii_digit() {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("-{byte:02x}"));
        }
    }
}

/// Decodes a readable role object name back into the role; `None` for any other name
/// (hashed names are read from the object's annotation instead).
pub fn role_of(object: &str) -> Option<String> {
    let escaped = object.strip_prefix(Kind::Role.prefix())?;
    if escaped.contains('.') {
        return None;
    }
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'-' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= MAX_OBJECT_NAME
            && name.split('.').all(|label| {
                let bytes = label.as_bytes();
                !bytes.is_empty()
                    && bytes[0].is_ascii_alphanumeric()
                    && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                    && bytes
                        .iter()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            })
    }

    #[test]
    fn examples() {
        assert_eq!(object_name(Kind::Role, "G/k"), "tenure--47-2fk");
        assert_eq!(object_name(Kind::Role, "reports"), "tenure-reports");
        assert_eq!(object_name(Kind::Member, "web-1"), "tenure.member-web-2d1");
        assert_eq!(object_name(Kind::Fence, "ledger"), "tenure.fence-ledger");
        assert_eq!(session_name(31), "tenure.session-1f");
        assert_eq!(role_of("tenure--47-2fk").as_deref(), Some("G/k"));
        assert_eq!(role_of("tenure.member-x"), None);
        assert_eq!(
            candidacy_name("G/k", "node-b"),
            "tenure.candidate--47-2fk.by-node-2db"
        );
        assert_eq!(role_of(&candidacy_name("reports", "a")), None);
        assert_eq!(role_label("reports").len(), 32);
    }

    #[test]
    fn long_candidacies_are_hashed_and_distinct() {
        let long = "x".repeat(240);
        let name = candidacy_name(&long, "node-a");
        assert!(name.starts_with("tenure.hc."), "{name}");
        assert!(is_dns_subdomain(&name));
        assert_ne!(name, candidacy_name("node-a", &long));
        assert_ne!(name, candidacy_name(&long, "node-b"));
    }

    #[test]
    fn long_names_are_hashed_and_valid() {
        let long = "Ü".repeat(127);
        let name = object_name(Kind::Role, &long);
        assert!(name.starts_with("tenure.hr."), "{name}");
        assert_eq!(name.len(), "tenure.hr.".len() + 64);
        assert!(is_dns_subdomain(&name));
        assert_ne!(name, object_name(Kind::Member, &long));
    }

    proptest::proptest! {
        #[test]
        fn every_name_is_a_valid_object_name_and_readable_ones_decode(name in "\\PC{1,80}") {
            for kind in [Kind::Role, Kind::Member, Kind::Fence] {
                let object = object_name(kind, &name);
                proptest::prop_assert!(is_dns_subdomain(&object), "{object}");
            }
            let role = object_name(Kind::Role, &name);
            if !role.starts_with("tenure.") {
                proptest::prop_assert_eq!(role_of(&role), Some(name.clone()));
            }
            let candidacy = candidacy_name(&name, &name);
            proptest::prop_assert!(is_dns_subdomain(&candidacy), "{candidacy}");
            proptest::prop_assert!(is_dns_subdomain(&role_label(&name)));
        }

        #[test]
        fn distinct_candidacies_get_distinct_objects(
            a in "[a-zA-Z0-9/._-]{1,8}", b in "[a-zA-Z0-9/._-]{1,8}",
            c in "[a-zA-Z0-9/._-]{1,8}", d in "[a-zA-Z0-9/._-]{1,8}",
        ) {
            proptest::prop_assume!((&a, &b) != (&c, &d));
            proptest::prop_assert_ne!(candidacy_name(&a, &b), candidacy_name(&c, &d));
        }

        #[test]
        fn distinct_names_get_distinct_objects(a in "[a-zA-Z0-9/._-]{1,12}", b in "[a-zA-Z0-9/._-]{1,12}") {
            proptest::prop_assume!(a != b);
            proptest::prop_assert_ne!(object_name(Kind::Role, &a), object_name(Kind::Role, &b));
        }
    }
}
