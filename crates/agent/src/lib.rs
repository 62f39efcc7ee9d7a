//! # inplaced
//!
//! On-node in-place update agent for bare-metal Kubernetes nodes managed by Cluster API.
//! It answers coverage reports (which changes of a desired [`sections::model::NodeSpec`] it can apply
//! in place, with what disruption, and whether the machine is hardware-bound), applies
//! them as crash-aware operations, and reports status over gRPC (`proto/inplace/v1`).
//!
//! Layout (DESIGN §5, ARCHITECTURE.md): [`spec`] (NodeSpec model and YAML form), [`node`]
//! (sysroot access and facts), [`sections`] (one module per NodeSpec section behind the
//! [`sections::kit::Section`] trait), [`plan`] (coverage: the pure diff of desired, observed and
//! applied, driven over the sections), [`bootloader`], [`kubelet`], [`cmdline`], [`ntp`] and
//! [`sysctl`] (format editors and domain rules), [`apply`] (the agent; its operation engine
//! is a state machine over [`phase`]), [`system`] (ServiceManager / Rebooter /
//! CommandRunner traits), [`state`] (the state directory), [`server`] and [`client`]
//! (gRPC), [`cli`] (the binaries); [`capi`] (CAPI in-place hook answers from coverage, no
//! I/O) and [`extension`] (the `inplace-extension` Runtime Extension server).
#![warn(missing_docs)]

pub mod apply;
pub mod bootloader;
pub mod cli;
pub mod config;
pub mod kubernetes;
pub mod metrics;
pub mod plan;
pub mod sections;
pub mod server;
pub mod spec;
pub mod state;
