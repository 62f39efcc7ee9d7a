//! # inplace-edge
//!
//! What the three binaries share at their network and process edges: mutual TLS with a
//! handshake deadline and the one identity rule ([`tls`], [`listener`]), connection caps
//! before and after the handshake ([`accept`], [`handshakes`], [`places`], [`calls`]),
//! connections closed from outside their I/O ([`closer`]), the counted and rate-limited
//! log of refused peers ([`refusals`]), the agent client channel ([`client`]), logging
//! ([`logging`]) and the process's exit and stop signals ([`process`]).

pub mod accept;
pub mod calls;
pub mod client;
pub mod closer;
pub mod exposition;
pub mod handshakes;
pub mod listener;
pub mod logging;
pub mod places;
pub mod process;
pub mod refusals;
pub mod tls;
