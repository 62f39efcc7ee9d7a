//! Change ids: the names the agent gives the items of a NodeSpec in `pb::Change.id`,
//! `pb::Drift.id` and the coverage report, and that the extension and the metrics read
//! back.
//!
//! Grammar (what the agent's sections write, each in its folder
//! `crates/agent/src/sections/<section>/`, through [`ChangeId`]'s `Display`):
//!
//! ```text
//! change-id = "files[" path "]"              ; files/, kit/file_items.rs (a written file)
//!           | "dropins[" name "]"            ; dropins/ (a node.d drop-in)
//!           | "kubelet.flags[" flag "]"      ; kubelet/ (a kubeadm-flags.env flag)
//!           | "kubelet.config" *segment      ; kubelet/ config_id (a KubeletConfiguration leaf)
//!           | "sysctls[" key "]"             ; sysctls/
//!           | "kernelArgs[" key "]"          ; kernel_args/ (one argument)
//!           | "kernelArgs"                   ; kernel_args/ (the staged boot as a whole)
//!           | "ntp"                          ; ntp/
//!           | "kubernetes.version"           ; kubernetes/
//! segment   = "." bare | "[" json-string "]"
//! bare      = 1*(any character but . [ ] ")
//! ```
//!
//! A bracketed `path`, `name`, `flag` or `key` is everything between the opening bracket
//! and the id's last `]`, verbatim (a path may hold brackets itself). A `kubelet.config`
//! segment that is empty or holds `.`, `[`, `]` or `"` is written as a JSON string in
//! brackets (`kubelet.config.evictionHard["memory.available"]`), so ids stay unique.
//!
//! [`ChangeId::parse`] is the one reader of this grammar: the extension's NodeSpec surgery
//! (`drop_item`), its MachineSet capability model (`capability_coverage`) and the agent's
//! metrics (`section_of`, here as [`section_of`]) use it.
//!
//! The one operation action text a reader tells apart is here too:
//! [`saved_original_action`] and [`is_saved_original`].

use std::fmt;

/// Change id of a Kubernetes version change.
pub const KUBERNETES_VERSION: &str = "kubernetes.version";

/// One parsed change id (see the module's grammar).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChangeId {
    /// `files[<path>]`: a whole file the agent writes.
    File(String),
    /// `dropins[<name>]`: a NodeSpec drop-in under `/etc/inplaced/node.d`.
    DropIn(String),
    /// `kubelet.flags[<name>]`: a kubelet flag in kubeadm-flags.env.
    KubeletFlag(String),
    /// `kubelet.config<segments>`: a KubeletConfiguration leaf by its path of keys
    /// (empty: the configuration as a whole).
    KubeletConfig(Vec<String>),
    /// `sysctls[<key>]`: a kernel parameter.
    Sysctl(String),
    /// `kernelArgs[<key>]`: one kernel command-line argument.
    KernelArg(String),
    /// `kernelArgs`: the kernel command line of the next boot as a whole.
    KernelArgs,
    /// `ntp`: the time servers.
    Ntp,
    /// `kubernetes.version`: the node's Kubernetes release.
    KubernetesVersion,
}

/// A string that is not a change id of the grammar ([`ChangeId::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a change id (files[path], dropins[name], kubelet.flags[name], kubelet.config.path, sysctls[key], kernelArgs[key], kernelArgs, ntp, kubernetes.version)"
)]
pub struct ChangeIdError(pub String);

/// Makes the id of a bracketed form from what is between its brackets.
type Bracketed = fn(String) -> ChangeId;

/// The bracketed forms: (prefix up to and with the `[`, constructor).
const BRACKETED: [(&str, Bracketed); 5] = [
    ("files[", ChangeId::File),
    ("dropins[", ChangeId::DropIn),
    ("kubelet.flags[", ChangeId::KubeletFlag),
    ("sysctls[", ChangeId::Sysctl),
    ("kernelArgs[", ChangeId::KernelArg),
];

const KUBELET_CONFIG: &str = "kubelet.config";

impl ChangeId {
    /// Parses `id` by the module's grammar. Errors: anything else, including a bracketed
    /// form without its closing `]` and a `kubelet.config` path with an empty bare segment
    /// or a bracket that is not a JSON string.
    pub fn parse(id: &str) -> Result<ChangeId, ChangeIdError> {
        let err = || ChangeIdError(id.to_string());
        match id {
            "ntp" => return Ok(ChangeId::Ntp),
            "kernelArgs" => return Ok(ChangeId::KernelArgs),
            KUBERNETES_VERSION => return Ok(ChangeId::KubernetesVersion),
            _ => {}
        }
        for (prefix, make) in BRACKETED {
            if let Some(rest) = id.strip_prefix(prefix) {
                return rest
                    .strip_suffix(']')
                    .map(|inner| make(inner.to_string()))
                    .ok_or_else(err);
            }
        }
        let rest = id.strip_prefix(KUBELET_CONFIG).ok_or_else(err)?;
        config_path(rest)
            .map(ChangeId::KubeletConfig)
            .ok_or_else(err)
    }

    /// The NodeSpec section the item belongs to, as the agent's metrics label it: `files`,
    /// `dropins`, `kubelet`, `sysctls`, `kernelArgs`, `ntp`, `kubernetes`.
    pub fn section(&self) -> &'static str {
        match self {
            ChangeId::File(_) => "files",
            ChangeId::DropIn(_) => "dropins",
            ChangeId::KubeletFlag(_) | ChangeId::KubeletConfig(_) => "kubelet",
            ChangeId::Sysctl(_) => "sysctls",
            ChangeId::KernelArg(_) | ChangeId::KernelArgs => "kernelArgs",
            ChangeId::Ntp => "ntp",
            ChangeId::KubernetesVersion => "kubernetes",
        }
    }
}

/// The segments of a `kubelet.config` path after its prefix (`.a.b["c.d"]`); None if it
/// does not follow the grammar.
fn config_path(mut rest: &str) -> Option<Vec<String>> {
    let mut path = Vec::new();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let seg = &r[..end];
            if needs_quotes(seg) {
                return None;
            }
            path.push(seg.to_string());
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let len = json_string_len(r)?;
            path.push(serde_json::from_str(&r[..len]).ok()?);
            rest = r[len..].strip_prefix(']')?;
        } else {
            return None;
        }
    }
    Some(path)
}

/// The length in bytes of the JSON string literal `s` starts with (quotes included).
fn json_string_len(s: &str) -> Option<usize> {
    let body = s.strip_prefix('"')?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i + 2),
            _ => {}
        }
    }
    None
}

/// Whether a `kubelet.config` segment is written quoted in brackets.
fn needs_quotes(seg: &str) -> bool {
    seg.is_empty() || seg.contains(['.', '[', ']', '"'])
}

impl std::str::FromStr for ChangeId {
    type Err = ChangeIdError;

    fn from_str(s: &str) -> Result<ChangeId, ChangeIdError> {
        ChangeId::parse(s)
    }
}

impl fmt::Display for ChangeId {
    /// The id as the agent writes it (the inverse of [`ChangeId::parse`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeId::File(p) => write!(f, "files[{p}]"),
            ChangeId::DropIn(n) => write!(f, "dropins[{n}]"),
            ChangeId::KubeletFlag(n) => write!(f, "kubelet.flags[{n}]"),
            ChangeId::Sysctl(k) => write!(f, "sysctls[{k}]"),
            ChangeId::KernelArg(k) => write!(f, "kernelArgs[{k}]"),
            ChangeId::KernelArgs => f.write_str("kernelArgs"),
            ChangeId::Ntp => f.write_str("ntp"),
            ChangeId::KubernetesVersion => f.write_str(KUBERNETES_VERSION),
            ChangeId::KubeletConfig(path) => {
                f.write_str(KUBELET_CONFIG)?;
                for seg in path {
                    if needs_quotes(seg) {
                        let quoted = serde_json::to_string(seg).map_err(|_| fmt::Error)?;
                        write!(f, "[{quoted}]")?;
                    } else {
                        write!(f, ".{seg}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// The NodeSpec section of a change id, for the agent's metrics: [`ChangeId::section`],
/// and for a string outside the grammar what comes before its first `[` or `.`
/// (`files[/etc/x]` → `files`, `kubelet.flags[x]` → `kubelet`, `kernelArgs` →
/// `kernelArgs`).
pub fn section_of(id: &str) -> &str {
    match ChangeId::parse(id) {
        Ok(c) => c.section(),
        Err(_) => &id[..id.find(['[', '.']).unwrap_or(id.len())],
    }
}

/// The action text (`pb::Operation.actions`) of an original saved before the agent
/// overwrote `path`: bookkeeping, not a change of the node.
pub fn saved_original_action(path: &str) -> String {
    format!("saved original of {path}")
}

/// Whether an action text is [`saved_original_action`]'s (the extension leaves those out
/// of what an update changed).
pub fn is_saved_original(action: &str) -> bool {
    action.starts_with("saved original")
}

#[cfg(test)]
mod tests;
