//! # inplace-agent
//!
//! The node agent behind `inplaced` and `inplacectl`: it answers coverage reports (which
//! changes of a desired [`sections::model::NodeSpec`] it can apply in place, with what disruption,
//! and whether the machine is hardware-bound), applies them as crash-aware operations,
//! and reports status over gRPC (`proto/inplace/v1`).
//!
//! [`spec`] (the rules every section shares: canonical hash, drop-in parsing), [`sections`]
//! (one folder per NodeSpec section behind [`sections::kit::Section`], the aggregates in
//! [`sections::model`]), [`plan`] (observe, then the pure diff
//! of desired, observed and applied driven over the sections), [`bootloader`] (the
//! kernel-argument backends over the `inplace_formats` editors), [`kubernetes`] (version
//! upgrades: sources, download, signatures, steps), [`apply`] (the agent and its operation
//! engine), [`state`] (the state directory), [`server`] (the gRPC service), [`config`]
//! (the agent's TOML), [`metrics`] and [`cli`] (the two front ends). Below it:
//! `inplace_edge`, `inplace_node`, `inplace_formats`, `inplace_wire` (ARCHITECTURE.md).

pub mod allocator;
mod apply;
mod bootloader;
pub mod cli;
pub mod config;
pub mod kubernetes;
mod metrics;
pub mod plan;
pub mod sections;
mod server;
mod spec;
mod state;
