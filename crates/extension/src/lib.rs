//! `inplace-extension`: the CAPI Runtime Extension that answers the in-place update hooks
//! from node coverage (HTTPS with rustls; agents over mutual-TLS gRPC).
//!
//! Routes (Runtime SDK, `POST`, JSON): `/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery`,
//! `.../canupdatemachine/can-update-machine`, `.../canupdatemachineset/can-update-machineset`,
//! `.../updatemachine/update-machine`; `GET /healthz`.
//!
//! Secrets: every bootstrap config is redacted ([`crate::capi::translate::redact`]) right
//! after parsing, before anything is logged or sent; request bodies are never logged; file
//! contents go to the agent only, never into messages.
//!
//! Map: [`capi`] is the pure translation and decision (no I/O); `hooks` holds one file per
//! hook, the table that names them (`hooks::Hook`) and the UpdateMachine driver over the
//! agent's operations (`hooks::driver`); `http` serves HTTPS and routes a request to its
//! hook within its deadline (`http::route`); `extension` is the [`Extension`] the hooks
//! share (configuration, resolver, agent channels); `agent` makes the bounded, counted
//! agent calls; `cluster` is the Kubernetes side (clients, drain, Node readiness, Events,
//! the Machine's addresses).

mod agent;
mod budget;
pub mod capi;
pub mod cli;
mod cluster;
pub mod config;
mod extension;
mod hooks;
mod http;
mod memory;
mod metrics;
mod pool;
mod resolve;
mod waiting;
