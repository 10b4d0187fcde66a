//! Shared test support for every tenure backend.
//!
//! - [`conformance`]: the SPEC's contract as plain `async fn scenario_*(backend)`
//!   functions; each backend crate's tests call every scenario with its own
//!   [`LeaseBackend`] / [`RegistryBackend`].
//! - throwaway servers (PostgreSQL, etcd) that tests start, stop, kill and pause.
//! - [`fuzz`] (feature `fuzz`): inputs for the parsers' property tests.
#![deny(missing_docs)]

pub mod conformance;
pub mod etcd;
mod fixture;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod postgres;
mod process;

pub use fixture::{LeaseBackend, LeaseFixture, RegistryBackend, RegistryFixture};
pub use process::off_runtime;
