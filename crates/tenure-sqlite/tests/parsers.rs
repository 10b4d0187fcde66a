//! Property tests of `sqlite:` URL parsing: random, mutated and valid URLs never panic,
//! every rejection is `InvalidArgument` naming `url`, a URL's password never appears in
//! the message, and an accepted URL names a path the file system can take.
//!
//! `PROPTEST_CASES` sets the depth (default 2,000 cases per property; the release run
//! in the README uses 100,000).

use proptest::prelude::*;
use tenure::Error;
use tenure_sqlite::path_from_url;
use tenure_testkit::fuzz;

proptest! {
    #![proptest_config(fuzz::config())]

    #[test]
    fn sqlite_urls_never_panic_nor_leak((secret, url) in fuzz::url_inputs(prop_oneof![
        3 => fuzz::sqlite_url(),
        1 => fuzz::store_url(),
    ])) {
        match path_from_url(&url) {
            Ok(path) => {
                let path = path.as_os_str().as_encoded_bytes();
                prop_assert!(!path.is_empty(), "{url:?} gave an empty path");
                prop_assert!(!path.contains(&0), "{url:?} gave a path with a NUL byte");
            }
            Err(error) => fuzz::check_refusal(&url, &error, &["url"], &secret)?,
        }
    }
}

/// Found by the property above: a NUL byte reached the file system, which refused it as
/// a store failure (exit 1) instead of bad usage.
#[test]
fn a_nul_byte_in_the_path_is_bad_usage() {
    for url in ["sqlite:\0.db", "sqlite:///tmp/a\0b.db"] {
        assert!(
            matches!(
                path_from_url(url),
                Err(Error::InvalidArgument { field: "url", .. })
            ),
            "{url:?}"
        );
    }
}
