//! # inplace-node
//!
//! The agent's only door to the host: [`sysroot`] (every node path through a directory
//! descriptor with `O_NOFOLLOW`, durable writes, fsync accounting), [`trust`] (sshd's
//! StrictModes rule over what the agent obeys), [`accounts`] (the node's own
//! `/etc/passwd` and `/etc/group`), [`facts`] (platform and preservation
//! recommendation), [`system`] (the service manager, reboot and command seams, with
//! recording fakes), [`digest`] and [`failpoint`] (named crash points for tests).
pub mod accounts;
pub mod digest;
pub mod facts;
pub mod failpoint;
pub mod sysroot;
pub mod system;
pub mod trust;
