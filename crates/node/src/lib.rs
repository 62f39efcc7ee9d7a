//! The node: sysroot access, accounts and facts.
pub mod accounts;
pub mod digest;
pub mod facts;
pub mod failpoint;
pub mod sysroot;
pub mod system;
pub mod trust;
