//! `EtcdFence`: the compare-and-reject fence kept in etcd, on a real server.

mod common;

use std::sync::Arc;

use tenure::{Error, FenceStore, FencingToken};
use tenure_etcd::EtcdFence;
use tenure_testkit::etcd::EtcdServer;

fn token(n: u64) -> FencingToken {
    FencingToken::from(n)
}

/// One server; fresh prefix. A first token is admitted, equal and higher ones too, lower
/// ones are refused with the highest named; tokens compare as numbers, not strings.
#[tokio::test]
async fn admits_equal_or_higher_and_refuses_lower() {
    let server = EtcdServer::shared().expect("shared etcd server");
    let client = common::client(&[server.endpoint()]).await;
    let fence = EtcdFence::new(client, &common::unique_prefix("fence")).unwrap();
    assert_eq!(fence.highest("ledger").await.unwrap(), None);
    fence.admit("ledger", token(9)).await.unwrap();
    fence.admit("ledger", token(9)).await.unwrap();
    // 10 > 9 although "10" < "9" as strings.
    fence.admit("ledger", token(10)).await.unwrap();
    match fence.admit("ledger", token(9)).await {
        Err(Error::Fenced { presented, highest }) => {
            assert_eq!((presented, highest), (token(9), token(10)));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(fence.highest("ledger").await.unwrap(), Some(token(10)));
    fence.admit("ledger", token(u64::MAX)).await.unwrap();
    assert!(fence.admit("ledger", token(u64::MAX - 1)).await.is_err());
    // Resources are independent.
    fence.admit("other", token(1)).await.unwrap();
    assert!(matches!(
        fence.admit("", token(1)).await,
        Err(Error::InvalidArgument {
            field: "resource",
            ..
        })
    ));
}

/// Many writers racing with different tokens: the fence ends at the highest, and every
/// admitted token was at least every token admitted before it (checked by the fence's
/// own answers: a token admitted after a higher one would be a violation).
#[tokio::test]
async fn racing_writers_never_go_backwards() {
    let server = EtcdServer::shared().expect("shared etcd server");
    let client = common::client(&[server.endpoint()]).await;
    let fence = Arc::new(EtcdFence::new(client, &common::unique_prefix("race")).unwrap());
    let mut tasks = Vec::new();
    for n in 1..=24u64 {
        let fence = fence.clone();
        tasks.push(tokio::spawn(async move {
            (n, fence.admit("ledger", token(n)).await)
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        let (n, result) = task.await.unwrap();
        match result {
            Ok(()) => admitted.push(n),
            Err(Error::Fenced { presented, highest }) => assert!(highest > presented),
            Err(other) => panic!("{other}"),
        }
    }
    assert!(
        admitted.contains(&24),
        "the highest token is always admitted"
    );
    assert_eq!(fence.highest("ledger").await.unwrap(), Some(token(24)));
}
