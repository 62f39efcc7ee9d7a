//! Command-line front ends: `inplaced` (the daemon) and `inplacectl` (the local client).
//! The binaries' `main`s only call [`daemon::main`] and [`ctl::main`]; errors are reported
//! here with their full context chain and no backtrace.
pub mod ctl;
pub mod daemon;
pub mod extension;
pub mod render;
