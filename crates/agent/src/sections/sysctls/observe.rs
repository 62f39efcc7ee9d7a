//! What the `sysctls` section observes: the live values under `/proc/sys` and the
//! sysctl.d files systemd-sysctl would read.

use std::collections::BTreeMap;

use crate::sections::kit::observe::{TextObs, Unknown};

/// A live kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlLive {
    /// Current value (trailing newline removed); meaningless when `unknown` is set.
    pub value: String,
    /// Whether the file under /proc/sys is writable at all.
    pub writable: bool,
    /// The file exists but its value could not be read, or read empty (a kernel
    /// parameter always has a value): why. A change of the key is then not covered.
    pub unknown: Option<Unknown>,
}

/// Sysctls as observed.
#[derive(Debug, Clone, Default)]
pub struct SysctlObs {
    /// Live values of the managed keys and of the keys of managed sysctl.d files
    /// (None = no such kernel parameter).
    pub live: BTreeMap<String, Option<SysctlLive>>,
    /// The agent's drop-in.
    pub drop_in: Option<TextObs>,
    /// Every sysctl.d file systemd-sysctl would read, in the order it applies them
    /// (node path, text); for a repeated name the /etc copy masks /run and /usr/lib.
    pub files: Vec<(String, String)>,
    /// sysctl.d directories and files that could not be read: what each of them would set
    /// at boot is unknown, so no key's boot value can be told.
    pub unreadable: Vec<Unknown>,
}
