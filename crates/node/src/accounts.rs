//! User and group resolution through the node's own `/etc/passwd` and `/etc/group`.
//!
//! Owners in a spec are resolved against the *sysroot's* account databases, never the
//! agent's host (NSS is not consulted): `etcd` is uid 997 on one fixture node and 994 on
//! another. Only the files are read, as `getpwnam(3)` with the `files` NSS module would.

use std::collections::BTreeMap;

/// Parsed account databases: user name → uid (with primary gid) and group name → gid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounts {
    users: BTreeMap<String, (u32, u32)>,
    groups: BTreeMap<String, u32>,
}

/// A user or group reference from a spec: a name or a numeric id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum IdRef {
    /// Resolved through the node's `/etc/passwd` or `/etc/group`.
    Name(String),
    /// Used as is.
    Id(u32),
}

impl IdRef {
    /// Parses `"etcd"` or `"997"`.
    pub fn parse(s: &str) -> IdRef {
        match s.parse::<u32>() {
            Ok(n) => IdRef::Id(n),
            Err(_) => IdRef::Name(s.to_string()),
        }
    }
}

impl std::fmt::Display for IdRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdRef::Name(n) => f.write_str(n),
            IdRef::Id(i) => write!(f, "{i}"),
        }
    }
}

impl Accounts {
    /// Parses `passwd(5)` and `group(5)` text (`name:x:uid:gid:...`, `name:x:gid:members`).
    /// Comment, blank and malformed lines (and NIS `+`/`-` entries) are skipped.
    pub fn parse(passwd: &str, group: &str) -> Accounts {
        let mut a = Accounts::default();
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 4 || f[0].is_empty() || f[0].starts_with(['#', '+', '-']) {
                continue;
            }
            if let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) {
                a.users.entry(f[0].to_string()).or_insert((uid, gid));
            }
        }
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 3 || f[0].is_empty() || f[0].starts_with(['#', '+', '-']) {
                continue;
            }
            if let Ok(gid) = f[2].parse() {
                a.groups.entry(f[0].to_string()).or_insert(gid);
            }
        }
        a
    }

    /// uid of a user reference; the error names the missing user and the file read.
    pub fn uid(&self, r: &IdRef) -> Result<u32, String> {
        match r {
            IdRef::Id(i) => Ok(*i),
            IdRef::Name(n) => self
                .users
                .get(n)
                .map(|u| u.0)
                .ok_or_else(|| format!("user {n:?} does not exist in the node's /etc/passwd")),
        }
    }

    /// gid of a group reference; the error names the missing group and the file read.
    pub fn gid(&self, r: &IdRef) -> Result<u32, String> {
        match r {
            IdRef::Id(i) => Ok(*i),
            IdRef::Name(n) => self
                .groups
                .get(n)
                .copied()
                .ok_or_else(|| format!("group {n:?} does not exist in the node's /etc/group")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_and_ids() {
        let a = Accounts::parse(
            "root:x:0:0:root:/root:/bin/bash\n# c\netcd:x:997:997::/var/lib/etcd:/usr/sbin/nologin\n",
            "root:x:0:\netcd:x:997:\n",
        );
        assert_eq!(a.uid(&IdRef::parse("etcd")), Ok(997));
        assert_eq!(a.gid(&IdRef::parse("etcd")), Ok(997));
        assert_eq!(a.uid(&IdRef::parse("1234")), Ok(1234));
        assert!(
            a.uid(&IdRef::parse("nosuchuser"))
                .unwrap_err()
                .contains("nosuchuser")
        );
    }
}
