//! Property tests of the name and metadata checks every backend runs on user input:
//! random, mutated and valid inputs never panic, and each rejection is
//! `InvalidArgument` naming the field it was asked to check.
//!
//! `PROPTEST_CASES` sets the depth (default 2,000 cases per property; the release run
//! in the README uses 100,000).

use proptest::prelude::*;
use tenure::lease::{validate_name, MAX_NAME_LEN};
use tenure::registry::{
    validate_metadata, MAX_METADATA_ENTRIES, MAX_METADATA_KEY_LEN, MAX_METADATA_VALUE_LEN,
};
use tenure::{Error, Metadata};
use tenure_testkit::fuzz;

/// Names as users write them: job names, host-pid owners, dotted node ids.
fn valid_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9][a-zA-Z0-9._:/@-]{0,40}"
}

/// What a name must be, said independently of the code under test.
fn acceptable(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && !name.chars().any(char::is_control)
}

const FIELDS: [&str; 5] = ["role", "owner", "node_id", "resource", "group"];

proptest! {
    #![proptest_config(fuzz::config())]

    /// Roles, owners, node ids, resources and group names: accepted exactly when
    /// non-empty, at most 255 bytes and free of NUL and control characters; otherwise
    /// `InvalidArgument` naming the field.
    #[test]
    fn names_are_checked_without_panicking(
        name in fuzz::inputs(valid_name()),
        field in proptest::sample::select(&FIELDS[..]),
    ) {
        match validate_name(field, &name) {
            Ok(()) => prop_assert!(acceptable(&name), "accepted {name:?}"),
            Err(Error::InvalidArgument { field: named, reason }) => {
                prop_assert!(!acceptable(&name), "refused {name:?}: {reason}");
                prop_assert_eq!(named, field);
                prop_assert!(!reason.is_empty());
            }
            Err(other) => prop_assert!(false, "{name:?}: not InvalidArgument: {other:?}"),
        }
    }

    /// Heartbeat metadata: never a panic; a map is refused (`InvalidArgument` naming
    /// `metadata`) exactly when it breaks a size limit or holds a NUL.
    #[test]
    fn metadata_is_checked_without_panicking(
        entries in prop_oneof![
            // A few entries of any text, or (to cross the entry limit) many plain ones.
            4 => proptest::collection::vec(
                (fuzz::inputs("[a-z][a-z0-9_.-]{0,20}"), fuzz::inputs("[ -~]{0,40}")),
                0..6,
            ),
            1 => proptest::collection::vec(
                ("[a-z]{1,8}", "[ -~]{0,8}"),
                (MAX_METADATA_ENTRIES - 4)..(MAX_METADATA_ENTRIES + 8),
            ),
        ],
    ) {
        let metadata: Metadata = entries.into_iter().collect();
        let acceptable = metadata.len() <= MAX_METADATA_ENTRIES
            && metadata.iter().all(|(key, value)| {
                !key.is_empty()
                    && key.len() <= MAX_METADATA_KEY_LEN
                    && value.len() <= MAX_METADATA_VALUE_LEN
                    && !key.contains('\0')
                    && !value.contains('\0')
            });
        match validate_metadata(&metadata) {
            Ok(()) => prop_assert!(acceptable, "accepted {metadata:?}"),
            Err(Error::InvalidArgument { field, reason }) => {
                prop_assert!(!acceptable, "refused {metadata:?}: {reason}");
                prop_assert_eq!(field, "metadata");
            }
            Err(other) => prop_assert!(false, "not InvalidArgument: {other:?}"),
        }
    }
}

/// Characters whose lower-case form is longer, and lone control characters past ASCII,
/// are judged by characters, not bytes.
#[test]
fn multi_byte_and_unicode_control_characters() {
    assert!(validate_name("role", "İstanbul-ß-𝄞").is_ok());
    assert!(validate_name("role", &"é".repeat(MAX_NAME_LEN / 2)).is_ok());
    assert!(validate_name("role", &"é".repeat(MAX_NAME_LEN / 2 + 1)).is_err());
    for bad in ["a\u{85}b", "a\u{7f}", "\0", "a\nb"] {
        assert!(
            matches!(
                validate_name("owner", bad),
                Err(Error::InvalidArgument { field: "owner", .. })
            ),
            "{bad:?}"
        );
    }
}
