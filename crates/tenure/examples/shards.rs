//! A shard group of 8 shards over three members in one process, on the in-memory store:
//! each member prints the shards it runs, then one member leaves and the others take its
//! shards over at once. `cargo run -p tenure --example shards`.

use std::sync::Arc;
use std::time::Duration;

use tenure::{
    InMemoryLeaseStore, InMemoryNodeRegistry, LeaseStore, NodeRegistry, ShardElector, ShardOptions,
};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), tenure::Error> {
    let store: Arc<dyn LeaseStore> = Arc::new(InMemoryLeaseStore::new());
    let registry: Arc<dyn NodeRegistry> =
        Arc::new(InMemoryNodeRegistry::new(Duration::from_secs(3))?);
    let mut members = Vec::new();
    for node in ["node-a", "node-b", "node-c"] {
        let elector = ShardElector::new(
            store.clone(),
            registry.clone(),
            ShardOptions {
                group: "reports".to_owned(),
                shards: 8,
                node_id: node.to_owned(),
                lease_ttl: Duration::from_secs(3),
                renew_interval: Duration::from_secs(1),
                ..Default::default()
            },
        )?;
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            elector
                .run(
                    move |shard, token, leadership: CancellationToken| async move {
                        // Stamp every side effect of this shard with `token`.
                        println!("{node} runs shard {shard} under token {token}");
                        leadership.cancelled().await;
                        println!("{node} stops shard {shard}");
                    },
                    stop,
                )
                .await
        });
        members.push((shutdown, task));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("-- node-a leaves");
    let (shutdown, task) = members.remove(0);
    shutdown.cancel();
    task.await.expect("member task")?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (shutdown, _) in &members {
        shutdown.cancel();
    }
    for (_, task) in members {
        task.await.expect("member task")?;
    }
    Ok(())
}
