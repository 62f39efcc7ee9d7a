//! The node: sysroot access, accounts and facts.
pub mod accounts;
pub mod facts;
pub mod sysroot;
pub mod trust;

pub use sysroot::Sysroot;
