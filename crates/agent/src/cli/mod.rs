//! Command-line front ends: `inplaced` (the daemon) and `inplacectl` (the local client).
//! The binaries' `main`s only call [`daemon::main`] and [`ctl::main`]; errors are reported
//! with their full context chain and no backtrace ([`inplace_edge::process::exit`]).
pub mod ctl;
pub mod daemon;
pub(crate) mod render;
pub(crate) mod validate;
