//! The diff view of a plan: for every file a plan's steps write or remove, its bytes now
//! against the bytes the steps leave, as a unified diff (`inplacectl coverage --diff`,
//! `apply --dry-run --diff`).
//!
//! Pure: the caller reads the current bytes (checking them against each step's `expect`
//! fingerprint, so the diff is of the node the plan was made from) and passes them in.
//! The diff is of the plan's own steps, the ones an apply executes: there is no second
//! renderer of any format. A Kubernetes upgrade's binaries and the files kubeadm
//! rewrites are added by [`crate::sections::kubernetes::diff`] (the caller merges them).
//!
//! Confidentiality (DESIGN §6: secret content is never logged or echoed back): the
//! content of `files` items and NodeSpec drop-ins (a drop-in may itself hold files) is
//! shown only when the caller asked with `show_content` and the server allowed it;
//! otherwise a diff names the file with its SHA-256 and size. A grubenv block (GRUB's
//! fixed 1024-byte environment file, see [`inplace_formats::grubenv`]) is shown as its
//! variable lines, without the `#` padding.

use std::collections::{BTreeMap, BTreeSet};

use crate::sections::kit::steps::Steps;
use crate::sections::model::NodeSpec;
use crate::state::AppliedRecord;
use inplace_node::digest::sha256_hex;
use inplace_wire::names::DROPIN_DIR;
use inplace_wire::pb;
use inplace_wire::pb::ChangeOperation;

/// Lines of context around each hunk, as `diff -u` and git print.
pub const CONTEXT_LINES: usize = 3;

/// Why a confidential file's content is not shown.
pub const WITHHELD_CONFIDENTIAL: &str = "confidential: files items and drop-ins may hold secrets; their content is shown only with show_content (`inplacectl coverage --diff --show-content`, or `apply --dry-run --diff --show-content`) to root on the node's local socket";

/// The paths a plan's steps touch, with the fingerprint
/// ([`FileObs::fingerprint`](crate::sections::kit::observe::FileObs::fingerprint)) each must still have: the
/// first step of a path names what the plan observed.
pub fn planned_paths(steps: &Steps) -> Vec<(&str, &str)> {
    let mut seen = BTreeSet::new();
    let writes = steps
        .writes
        .iter()
        .map(|w| (w.path.as_str(), w.expect.as_str()));
    let removes = steps
        .removes
        .iter()
        .map(|r| (r.path.as_str(), r.expect.as_str()));
    writes
        .chain(removes)
        .filter(|(p, _)| seen.insert(*p))
        .collect()
}

/// Node paths whose content is confidential: the spec's `files` items, files of that
/// section in the applied record (being restored or removed), and NodeSpec drop-ins.
pub fn confidential_paths(desired: &NodeSpec, record: &AppliedRecord) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = desired.files.iter().map(|f| f.path.clone()).collect();
    out.extend(
        record
            .files
            .iter()
            .filter(|(_, m)| m.item.is_none())
            .map(|(p, _)| p.clone()),
    );
    out.extend(desired.dropins.iter().map(|d| d.path()));
    out.extend(
        record
            .files
            .keys()
            .filter(|p| p.starts_with(&format!("{DROPIN_DIR}/")))
            .cloned(),
    );
    out
}

/// The diffs of `steps`: one per path written or removed, sorted by path. `before` holds
/// each path's current bytes (None = absent), `changes` the plan's changes (their
/// `targets` name the paths), `confidential` the paths whose content is shown only with
/// `show_content`.
pub fn file_diffs(
    steps: &Steps,
    before: &BTreeMap<String, Option<Vec<u8>>>,
    changes: &[pb::Change],
    confidential: &BTreeSet<String>,
    show_content: bool,
) -> Vec<pb::FileDiff> {
    // the last step of a path is what the node ends with
    let mut after: BTreeMap<&str, Option<&[u8]>> = BTreeMap::new();
    for w in &steps.writes {
        after.insert(&w.path, Some(&w.content));
    }
    for r in &steps.removes {
        after.insert(&r.path, None);
    }
    after
        .into_iter()
        .map(|(path, new)| {
            let old = before.get(path).and_then(|b| b.as_deref());
            let hidden = !show_content && confidential.contains(path);
            file_diff(path, old, new, changes, hidden)
        })
        .collect()
}

fn file_diff(
    path: &str,
    old: Option<&[u8]>,
    new: Option<&[u8]>,
    changes: &[pb::Change],
    hidden: bool,
) -> pb::FileDiff {
    let operation = match (old, new) {
        (None, _) => ChangeOperation::Create,
        (Some(_), None) => ChangeOperation::Delete,
        (Some(_), Some(_)) => ChangeOperation::Update,
    };
    let (unified, withheld) = if old == new {
        (String::new(), String::new())
    } else if hidden {
        (String::new(), WITHHELD_CONFIDENTIAL.to_string())
    } else {
        match unified(path, old, new) {
            Ok(u) => (u, String::new()),
            Err(why) => (String::new(), why),
        }
    };
    let mut change_ids: Vec<String> = changes
        .iter()
        .filter(|c| c.targets.iter().any(|t| t == path))
        .map(|c| c.id.clone())
        .collect();
    change_ids.sort();
    let sha = |b: Option<&[u8]>| b.map_or(String::new(), |b| format!("sha256:{}", sha256_hex(b)));
    let size = |b: Option<&[u8]>| b.map_or(0, |b| b.len() as u64);
    pb::FileDiff {
        path: path.to_string(),
        operation: operation as i32,
        change_ids,
        before_sha256: sha(old),
        after_sha256: sha(new),
        before_size: size(old),
        after_size: size(new),
        unified,
        withheld,
        after_unknown: false,
    }
}

/// The unified diff of two versions of `path` (None = absent, shown as `/dev/null`), or
/// why it can not be shown as text.
fn unified(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> Result<String, String> {
    let old_text = old.map(display_text).transpose()?;
    let new_text = new.map(display_text).transpose()?;
    let diff = similar::TextDiff::from_lines(
        old_text.as_deref().unwrap_or(""),
        new_text.as_deref().unwrap_or(""),
    );
    let a = if old.is_some() { path } else { "/dev/null" };
    let b = if new.is_some() { path } else { "/dev/null" };
    Ok(diff
        .unified_diff()
        .context_radius(CONTEXT_LINES)
        .header(a, b)
        .to_string())
}

/// The text a file is diffed as: a grubenv block's signature and variable lines (its
/// padding dropped), else the file itself when it is UTF-8.
fn display_text(bytes: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "binary: not UTF-8 text (invalid byte at offset {}); compare the SHA-256 values",
            e.valid_up_to()
        )
    })?;
    if is_grubenv(bytes) {
        // the block ends in '#' padding up to 1024 bytes, on the last line
        let end = text.rfind('\n').map_or(0, |i| i + 1);
        if text[end..].bytes().all(|b| b == b'#') {
            return Ok(text[..end].to_string());
        }
    }
    Ok(text.to_string())
}

/// A GRUB environment block: the signature, and exactly 1024 bytes (grub-editenv's size).
fn is_grubenv(bytes: &[u8]) -> bool {
    bytes.len() == 1024 && bytes.starts_with(inplace_formats::grubenv::SIGNATURE.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sections::kit::steps::{Remove, Write};

    fn write(path: &str, content: &[u8]) -> Write {
        Write {
            path: path.into(),
            content: content.to_vec(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            keep_meta: true,
            expect: String::new(),
            save_original: None,
            managed_file: false,
        }
    }

    fn change(id: &str, target: &str) -> pb::Change {
        pb::Change {
            id: id.into(),
            targets: vec![target.into()],
            ..Default::default()
        }
    }

    #[test]
    fn an_update_is_a_unified_diff_with_context_and_change_ids() {
        let steps = Steps {
            writes: vec![write("/etc/a.conf", b"1\n2\n3\n4\nx=1\n5\n")],
            ..Default::default()
        };
        let before = BTreeMap::from([(
            "/etc/a.conf".to_string(),
            Some(b"1\n2\n3\n4\nx=0\n5\n".to_vec()),
        )]);
        let changes = [change("b", "/etc/a.conf"), change("a", "/etc/a.conf")];
        let d = file_diffs(&steps, &before, &changes, &BTreeSet::new(), false);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].change_ids, ["a", "b"]);
        assert_eq!(d[0].operation, ChangeOperation::Update as i32);
        assert_eq!(
            d[0].unified,
            "--- /etc/a.conf\n+++ /etc/a.conf\n@@ -2,5 +2,5 @@\n 2\n 3\n 4\n-x=0\n+x=1\n 5\n"
        );
        assert_eq!(d[0].before_size, 14);
        assert_eq!(
            d[0].after_sha256,
            format!("sha256:{}", sha256_hex(b"1\n2\n3\n4\nx=1\n5\n"))
        );
    }

    #[test]
    fn created_and_removed_files_diff_against_dev_null() {
        let steps = Steps {
            writes: vec![write("/etc/new", b"a\n")],
            removes: vec![Remove {
                path: "/etc/old".into(),
                expect: String::new(),
                dirs: vec![],
            }],
            ..Default::default()
        };
        let before = BTreeMap::from([
            ("/etc/new".to_string(), None),
            ("/etc/old".to_string(), Some(b"b\n".to_vec())),
        ]);
        let d = file_diffs(&steps, &before, &[], &BTreeSet::new(), false);
        assert_eq!(
            d[0].unified,
            "--- /dev/null\n+++ /etc/new\n@@ -0,0 +1 @@\n+a\n"
        );
        assert_eq!(d[0].operation, ChangeOperation::Create as i32);
        assert_eq!(d[0].before_sha256, "");
        assert_eq!(
            d[1].unified,
            "--- /etc/old\n+++ /dev/null\n@@ -1 +0,0 @@\n-b\n"
        );
        assert_eq!(d[1].operation, ChangeOperation::Delete as i32);
        assert_eq!(d[1].after_size, 0);
    }

    #[test]
    fn confidential_content_is_named_by_hash_unless_shown() {
        let steps = Steps {
            writes: vec![write("/etc/secret", b"token=s3cr3t\n")],
            ..Default::default()
        };
        let before = BTreeMap::from([("/etc/secret".to_string(), None)]);
        let conf = BTreeSet::from(["/etc/secret".to_string()]);
        let hidden = &file_diffs(&steps, &before, &[], &conf, false)[0];
        assert_eq!(hidden.unified, "");
        assert_eq!(hidden.withheld, WITHHELD_CONFIDENTIAL);
        assert_eq!(hidden.after_size, 13);
        assert_eq!(
            hidden.after_sha256,
            format!("sha256:{}", sha256_hex(b"token=s3cr3t\n"))
        );
        assert!(!format!("{hidden:?}").contains("s3cr3t"));
        let shown = &file_diffs(&steps, &before, &[], &conf, true)[0];
        assert!(shown.unified.contains("+token=s3cr3t\n"), "{shown:?}");
        assert_eq!(shown.withheld, "");
    }

    #[test]
    fn grubenv_shows_variables_not_padding() {
        let block = |vars: &str| {
            let mut b = format!("{}{vars}", inplace_formats::grubenv::SIGNATURE).into_bytes();
            b.resize(1024, b'#');
            b
        };
        let steps = Steps {
            writes: vec![write(
                "/boot/grub2/grubenv",
                &block("kernelopts=ro quiet\n"),
            )],
            ..Default::default()
        };
        let before = BTreeMap::from([(
            "/boot/grub2/grubenv".to_string(),
            Some(block("kernelopts=ro\n")),
        )]);
        let d = &file_diffs(&steps, &before, &[], &BTreeSet::new(), false)[0];
        assert_eq!(
            d.unified,
            "--- /boot/grub2/grubenv\n+++ /boot/grub2/grubenv\n@@ -1,2 +1,2 @@\n # GRUB Environment Block\n-kernelopts=ro\n+kernelopts=ro quiet\n"
        );
        assert_eq!((d.before_size, d.after_size), (1024, 1024));
    }

    #[test]
    fn files_items_and_dropins_are_confidential_also_when_they_leave_the_spec() {
        let managed = |item: Option<&str>| crate::state::ManagedFile {
            sha256: String::new(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            original: crate::state::Original::Absent,
            created_dirs: vec![],
            item: item.map(str::to_string),
        };
        let desired = NodeSpec {
            files: vec![crate::sections::kit::file_items::FileSpec {
                path: "/etc/in-spec".into(),
                content: vec![],
                sha256: String::new(),
                mode: 0o600,
                owner: None,
                group: None,
            }],
            dropins: vec![crate::sections::dropins::spec::DropInSpec {
                name: "10-new.yaml".into(),
                content: String::new(),
                sha256: String::new(),
            }],
            ..Default::default()
        };
        let mut record = AppliedRecord::default();
        record.files.insert("/etc/dropped".into(), managed(None));
        record
            .files
            .insert("/etc/chrony.conf".into(), managed(Some("ntp")));
        record.files.insert(
            format!("{DROPIN_DIR}/05-old.yaml"),
            managed(Some("dropins[05-old.yaml]")),
        );
        let got: Vec<String> = confidential_paths(&desired, &record).into_iter().collect();
        assert_eq!(
            got,
            [
                "/etc/dropped".to_string(),
                "/etc/in-spec".into(),
                format!("{DROPIN_DIR}/05-old.yaml"),
                format!("{DROPIN_DIR}/10-new.yaml"),
            ]
        );
    }

    #[test]
    fn binary_content_is_named_by_hash() {
        let steps = Steps {
            writes: vec![write("/etc/blob", &[0xff, 0x00, 0x01])],
            ..Default::default()
        };
        let before = BTreeMap::from([("/etc/blob".to_string(), Some(vec![0x00]))]);
        let d = &file_diffs(&steps, &before, &[], &BTreeSet::new(), true)[0];
        assert_eq!(d.unified, "");
        assert!(d.withheld.starts_with("binary: "), "{d:?}");
    }

    #[test]
    fn the_first_step_of_a_path_names_its_expected_state() {
        let mut a = write("/etc/a", b"1");
        a.expect = "absent".into();
        let mut again = write("/etc/a", b"2");
        again.expect = "sha256:x".into();
        let steps = Steps {
            writes: vec![a, again],
            ..Default::default()
        };
        assert_eq!(planned_paths(&steps), [("/etc/a", "absent")]);
    }
}
