//! The `files` section's part of the NodeSpec: whole files, validated (absolute,
//! normalized paths outside the kernel interfaces, within Linux's length limits; mode
//! bits; owner and group), each path written by one source only, hashed by the content's
//! digest. The type, [`FileSpec`], is the shared file machinery's
//! ([`crate::sections::kit::file_items`]), which the `ntp` and `dropins` sections write
//! through too.

use std::collections::BTreeMap;

use crate::sections::kit::file_items::FileSpec;
use inplace_node::accounts::IdRef;
use inplace_node::digest::sha256_hex;
use inplace_wire::names::SpecError;
use inplace_wire::pb;

/// Default file mode when a spec gives none.
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o644;

/// Validates the wire `files` of one document, in order. Errors name the field
/// (`files[2].path`, `files[0].mode`, `files[1].owner`); a path given twice is an error
/// naming both items.
pub(crate) fn from_pb(p: &[pb::File]) -> Result<Vec<FileSpec>, SpecError> {
    let mut files = Vec::with_capacity(p.len());
    let mut seen = BTreeMap::new();
    for (i, f) in p.iter().enumerate() {
        let field = format!("files[{i}]");
        validate_path(&format!("{field}.path"), &f.path)?;
        if let Some(j) = seen.insert(f.path.clone(), i) {
            return Err(SpecError::new(
                format!("{field}.path"),
                format!("{} is also files[{j}]; give each path once", f.path),
            ));
        }
        let mode = f.mode.unwrap_or(DEFAULT_FILE_MODE);
        if mode > 0o7777 {
            return Err(SpecError::new(
                format!("{field}.mode"),
                format!(
                    "mode {mode:#o} has bits beyond 07777; give permission bits such as \"0644\""
                ),
            ));
        }
        let (owner, group) = owner_refs(&field, &f.owner, &f.group)?;
        files.push(FileSpec {
            path: f.path.clone(),
            sha256: sha256_hex(&f.content),
            content: f.content.clone(),
            mode,
            owner,
            group,
        });
    }
    Ok(files)
}

/// Which source wrote each path (`files[0]`, `dropins[<name>].files[1]`), for errors
/// naming both.
#[derive(Debug, Default)]
pub(crate) struct Sources(BTreeMap<String, String>);

impl Sources {
    /// The source of the item at `path`, if any.
    pub(crate) fn source_of(&self, path: &str) -> Option<&str> {
        self.0.get(path).map(String::as_str)
    }
}

/// Merges the `files` of a source found under `prefix` into `spec`: a path another
/// source writes too is an error naming both, even with the same content; so is a path
/// below another item's path (`/etc/a/b` with `/etc/a`), in either order: one of the two
/// would have to be a directory and a file at once, so no apply could succeed, and the
/// verifying re-plan blamed "another writer".
pub(crate) fn merge(
    sources: &mut Sources,
    spec: &mut Vec<FileSpec>,
    part: Vec<FileSpec>,
    prefix: &str,
) -> Result<(), SpecError> {
    for (j, f) in part.into_iter().enumerate() {
        let src = format!("{prefix}files[{j}]");
        if let Some(other) = sources.0.get(&f.path) {
            return Err(SpecError::new(
                format!("{src}.path"),
                format!("{} is also written by {other}; give each path once", f.path),
            ));
        }
        if let Some((file, other)) = nested(sources, &f.path) {
            return Err(SpecError::new(
                format!("{src}.path"),
                format!(
                    "{} and {file} ({other}) can not both be files: one is a directory \
                     of the other; give files at paths that do not contain each other",
                    f.path
                ),
            ));
        }
        sources.0.insert(f.path.clone(), src);
        spec.push(f);
    }
    Ok(())
}

/// An item of `sources` whose path is a directory above `path`, or below it, and its
/// source.
fn nested<'a>(sources: &'a Sources, path: &str) -> Option<(&'a str, &'a str)> {
    let above = path
        .match_indices('/')
        .filter(|(i, _)| *i > 0)
        .find_map(|(i, _)| sources.0.get_key_value(&path[..i]));
    let below = || {
        let dir = format!("{path}/");
        sources
            .0
            .range(dir.clone()..)
            .next()
            .filter(|(p, _)| p.starts_with(&dir))
    };
    above.or_else(below).map(|(p, s)| (p.as_str(), s.as_str()))
}

/// The section's part of the canonical hash: `files`, each path with the digest of its
/// content, its mode, owner and group (always present: the hash of every spec has it).
pub(crate) fn hash(files: &[FileSpec], v: &mut serde_json::Map<String, serde_json::Value>) {
    let files: Vec<serde_json::Value> = files
        .iter()
        .map(|f| {
            serde_json::json!({
                "path": f.path,
                "content": f.sha256,
                "mode": f.mode,
                "owner": f.owner.as_ref().map(|o| o.to_string()),
                "group": f.group.as_ref().map(|o| o.to_string()),
            })
        })
        .collect();
    v.insert("files".into(), serde_json::Value::Array(files));
}

fn validate_path(field: &str, path: &str) -> Result<(), SpecError> {
    if path.is_empty() {
        return Err(SpecError::new(
            field,
            "path is empty; give an absolute path such as /etc/sysctl.d/90-tuning.conf",
        ));
    }
    if !path.starts_with('/') {
        return Err(SpecError::new(
            field,
            format!("path {path:?} is relative; give an absolute path starting with '/'"),
        ));
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(SpecError::new(
            field,
            "path contains a control character (NUL, newline, tab...); such paths are refused",
        ));
    }
    for prefix in ["/proc", "/sys", "/dev"] {
        if path == prefix || path.starts_with(&format!("{prefix}/")) {
            return Err(SpecError::new(
                field,
                format!(
                    "{path} is under {prefix}, a kernel interface, not a file to manage; use the sysctls section for /proc/sys"
                ),
            ));
        }
    }
    if path == "/" {
        return Err(SpecError::new(
            field,
            "path is the root directory; name a file",
        ));
    }
    if inplace_node::sysroot::components(path).is_err() {
        return Err(SpecError::new(
            field,
            format!("path {path:?} is not normalized; remove '.', '..', repeated or trailing '/'"),
        ));
    }
    validate_path_length(field, path)
}

/// Linux's limits: a file name of at most 255 bytes (NAME_MAX), a path of at most 4095
/// bytes (PATH_MAX, 4096 with its terminating NUL).
fn validate_path_length(field: &str, path: &str) -> Result<(), SpecError> {
    if let Some(c) = path.split('/').find(|c| c.len() > 255) {
        let shown: String = c.chars().take(16).collect();
        return Err(SpecError::new(
            field,
            format!(
                "path component {shown:?}... is {} bytes, over the 255-byte file name limit of Linux (NAME_MAX)",
                c.len()
            ),
        ));
    }
    if path.len() > 4095 {
        return Err(SpecError::new(
            field,
            format!(
                "path is {} bytes, over the 4096-byte path limit of Linux (PATH_MAX, with its terminating NUL)",
                path.len()
            ),
        ));
    }
    Ok(())
}

/// Splits `owner` ("user", "user:group", "997:997") and `group` into references.
pub(crate) fn owner_refs(
    field: &str,
    owner: &str,
    group: &str,
) -> Result<(Option<IdRef>, Option<IdRef>), SpecError> {
    let (user, from_owner) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    if let Some(g) = from_owner
        && !group.is_empty()
        && g != group
    {
        return Err(SpecError::new(
            format!("{field}.group"),
            format!(
                "owner {owner:?} names group {g:?} but group is {group:?}; give the group once"
            ),
        ));
    }
    let group = if group.is_empty() {
        from_owner.unwrap_or("")
    } else {
        group
    };
    if owner.contains(':') && (user.is_empty() || from_owner.is_some_and(str::is_empty)) {
        return Err(SpecError::new(
            format!("{field}.owner"),
            format!("{owner:?} has an empty user or group; write \"user\" or \"user:group\""),
        ));
    }
    for (f, v) in [("owner", user), ("group", group)] {
        if v.parse::<u32>() == Ok(u32::MAX) {
            return Err(SpecError::new(
                format!("{field}.{f}"),
                "4294967295 is (uid_t)-1, which chown(2) reads as \"leave unchanged\"; give a real id",
            ));
        }
        if v.chars()
            .any(|c| c.is_whitespace() || c == ':' || c == '/' || c.is_control())
        {
            return Err(SpecError::new(
                format!("{field}.{f}"),
                format!("{v:?} is not a valid user or group name or numeric id"),
            ));
        }
    }
    let r = |s: &str| (!s.is_empty()).then(|| IdRef::parse(s));
    Ok((r(user), r(group)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_path_containing_another_is_nested() {
        let mut s = Sources::default();
        s.0.insert("/etc/a".into(), "files[0]".into());
        s.0.insert("/etc/x/y/z".into(), "dropins[d].files[0]".into());
        assert_eq!(nested(&s, "/etc/a/b"), Some(("/etc/a", "files[0]")));
        assert_eq!(
            nested(&s, "/etc/x"),
            Some(("/etc/x/y/z", "dropins[d].files[0]"))
        );
        assert_eq!(
            nested(&s, "/etc/x/y"),
            Some(("/etc/x/y/z", "dropins[d].files[0]"))
        );
        assert_eq!(nested(&s, "/etc"), Some(("/etc/a", "files[0]")));
        for free in ["/etc/ab", "/etc/a.d/b", "/etc/x/yz", "/etc/b"] {
            assert_eq!(nested(&s, free), None, "{free}");
        }
    }
}
