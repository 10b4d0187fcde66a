//! In-memory backends: one process, time from an injected [`Clock`](crate::Clock).
//!
//! For tests, simulations and single-node use. Tokens live only as long as the store
//! value; use a durable backend when leadership must span processes.

mod lease;
mod registry;
mod slot;

pub use lease::InMemoryLeaseStore;
pub use registry::InMemoryNodeRegistry;
