//! Property tests of `etcd://` URL parsing: random, mutated and valid URLs never panic,
//! every rejection is `InvalidArgument` naming `url` or `prefix`, a URL's password never
//! appears in the message, and every accepted endpoint is a URI the gRPC client takes
//! (so a URL that parses cannot fail later as a store error).
//!
//! `PROPTEST_CASES` sets the depth (default 2,000 cases per property; the release run
//! in the README uses 100,000).

use proptest::prelude::*;
use tenure::Error;
use tenure_etcd::EtcdUrl;
use tenure_testkit::fuzz;

proptest! {
    #![proptest_config(fuzz::config())]

    #[test]
    fn etcd_urls_never_panic_nor_leak((secret, url) in fuzz::url_inputs(prop_oneof![
        3 => fuzz::etcd_url(),
        1 => fuzz::store_url(),
    ])) {
        match EtcdUrl::parse(&url) {
            Ok(parsed) => {
                prop_assert!(!parsed.endpoints().is_empty());
                for endpoint in parsed.endpoints() {
                    let uri = endpoint.parse::<http::Uri>();
                    prop_assert!(uri.is_ok(), "{url:?}: endpoint {endpoint:?} is no URI: {uri:?}");
                }
                prop_assert!(parsed.prefix().starts_with('/'), "{url:?}: prefix {:?}", parsed.prefix());
            }
            Err(error) => fuzz::check_refusal(&url, &error, &["url", "prefix"], &secret)?,
        }
    }
}

/// Found by the property above: a host the gRPC client cannot take as a URI (non-ASCII,
/// or bracketed but not IPv6) was accepted, so a typo surfaced only as "no etcd
/// endpoint reachable", a store failure, instead of bad usage naming the endpoint.
#[test]
fn hosts_the_client_cannot_take_are_bad_usage() {
    for url in [
        "etcd://éaa00a--0a00.aaa.aa:10000/00/_/aA-0_aaA",
        "etcd://[zz]:2379",
        "etcd://[::1%25eth0]:2379",
        "etcd://a%20b:2379",
    ] {
        assert!(
            matches!(
                EtcdUrl::parse(url),
                Err(Error::InvalidArgument { field: "url", .. })
            ),
            "{url:?}"
        );
    }
    let url =
        EtcdUrl::parse("etcd://etcd-1.internal_zone:2379,10.0.0.7:2379,[fe80::1]:2379").unwrap();
    assert_eq!(
        url.endpoints(),
        [
            "http://etcd-1.internal_zone:2379",
            "http://10.0.0.7:2379",
            "http://[fe80::1]:2379"
        ]
    );
}
