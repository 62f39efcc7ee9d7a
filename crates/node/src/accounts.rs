//! User and group resolution through the node's own `/etc/passwd` and `/etc/group`.
//!
//! Owners in a spec are resolved against the *sysroot's* account databases, never the
//! agent's host (NSS is not consulted): `etcd` is uid 997 on one fixture node and 994 on
//! another. Only the files are read, as `getpwnam(3)` with the `files` NSS module would.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Parsed account databases: user name → uid (with primary gid) and group name → gid.
/// Each database is shared (`Arc`), so a reader that keeps the parse of an unchanged file
/// (the sysroot's memo) builds an `Accounts` without parsing again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounts {
    users: Arc<Users>,
    groups: Arc<Groups>,
}

/// `passwd(5)` parsed: user name → (uid, primary gid). The first line of a name wins, as
/// `getpwnam(3)` finds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Users(BTreeMap<String, (u32, u32)>);

/// `group(5)` parsed: group name → gid. The first line of a name wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups(BTreeMap<String, u32>);

/// The fields of a `passwd(5)`/`group(5)` line with at least `min` of them; None for a
/// comment, blank or malformed line, or a NIS `+`/`-` entry.
fn fields(line: &str, min: usize) -> Option<Vec<&str>> {
    let f: Vec<&str> = line.split(':').collect();
    (f.len() >= min && !f[0].is_empty() && !f[0].starts_with(['#', '+', '-'])).then_some(f)
}

impl Users {
    /// Parses `passwd(5)` text (`name:x:uid:gid:...`); comment, blank and malformed
    /// lines (and NIS `+`/`-` entries) are skipped.
    pub fn parse(passwd: &str) -> Users {
        let mut users = BTreeMap::new();
        for f in passwd.lines().filter_map(|l| fields(l, 4)) {
            if let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) {
                users.entry(f[0].to_string()).or_insert((uid, gid));
            }
        }
        Users(users)
    }
}

impl Groups {
    /// Parses `group(5)` text (`name:x:gid:members`); comment, blank and malformed lines
    /// (and NIS `+`/`-` entries) are skipped.
    pub fn parse(group: &str) -> Groups {
        let mut groups = BTreeMap::new();
        for f in group.lines().filter_map(|l| fields(l, 3)) {
            if let Ok(gid) = f[2].parse() {
                groups.entry(f[0].to_string()).or_insert(gid);
            }
        }
        Groups(groups)
    }
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
    /// Parses `passwd(5)` and `group(5)` text ([`Users::parse`], [`Groups::parse`]).
    pub fn parse(passwd: &str, group: &str) -> Accounts {
        Accounts::from_parts(
            Arc::new(Users::parse(passwd)),
            Arc::new(Groups::parse(group)),
        )
    }

    /// The databases parsed before (and kept, e.g. by the sysroot's memo).
    pub fn from_parts(users: Arc<Users>, groups: Arc<Groups>) -> Accounts {
        Accounts { users, groups }
    }

    /// uid of a user reference; the error names the missing user and the file read.
    pub fn uid(&self, r: &IdRef) -> Result<u32, String> {
        match r {
            IdRef::Id(i) => Ok(*i),
            IdRef::Name(n) => self
                .users
                .0
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
                .0
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
