//! The diff view of a Kubernetes version upgrade (issue 27 §5): every file the planned
//! [`Upgrade`] replaces, creates or has a tool rewrite, as [`pb::FileDiff`] entries
//! beside the other sections' file diffs ([`crate::plan::diff`]).
//!
//! - Each binary installed (`<bin_dir>/kubeadm`, `kubelet`, and `kubectl` when
//!   `[kubernetes] kubectl`): before, the SHA-256 and size of the node's file (streamed,
//!   never held in memory); after, for `source = "url"`, the SHA-256 its `.sha256`
//!   checksum file publishes (upstream's layout holds only the digest) and the size the
//!   mirror gives for the binary (`Content-Length` of a `HEAD`; 0 with a note when it
//!   gives none). The download is verified against that digest (and the signature)
//!   before anything is installed, so the after side is what lands or nothing does. For
//!   `apt`/`dnf` the package manager installs it: the after side is not known ahead.
//! - `url` only: the copy of each replaced binary the upgrade keeps for its roll-back,
//!   `<backup_dir>/<binary>-<old version>` (after = the node's binary now).
//! - The files `kubeadm upgrade node` rewrites: the kubelet's `config.yaml` (the
//!   kubelet-config phase, from the cluster's `kubelet-config` ConfigMap), its
//!   `kubeadm-flags.env` (rewritten when the new kubelet dropped a flag kubeadm set) and,
//!   on a control-plane node, the static Pod manifests present in `manifests_dir`
//!   (kube-apiserver, kube-controller-manager, kube-scheduler, etcd): before as on the
//!   node, after "not known ahead" ([`pb::FileDiff::after_unknown`]).
//!
//! Network: for `url`, one `GET` of each `.sha256` (at most 4 KiB) and one `HEAD` of
//! each binary, with a timeout of at most [`ASK_TIMEOUT_SECS`]; nothing is downloaded.
//! A checksum file that can not be read makes that binary's after side "not known
//! ahead", naming why (the apply would fail before installing anything).

use std::io::Read;

use crate::config::Config;
use crate::kubernetes as k8s;
use crate::kubernetes::upgrade::Upgrade;
use crate::kubernetes::{CONTROL_PLANE_COMPONENTS, SourceKind};
use inplace_node::sysroot::Sysroot;
use inplace_wire::pb;
use inplace_wire::pb::ChangeOperation;
use sha2::{Digest, Sha256};

/// Why a file `kubeadm upgrade node` rewrites has no after side.
pub(crate) const REWRITTEN_BY_KUBEADM: &str =
    "rewritten by kubeadm upgrade node, content not known ahead";

/// Why the kubelet flags file has no after side.
pub(crate) const FLAGS_MAY_BE_REWRITTEN: &str = "may be rewritten by kubeadm upgrade node (it removes kubelet flags the new version dropped), content not known ahead";

/// Longest one checksum `GET` or size `HEAD` of the diff view may take, in seconds.
pub(crate) const ASK_TIMEOUT_SECS: u64 = 5;

/// A file's content by digest: hex SHA-256 and size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sum {
    /// Lower-case hex SHA-256.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// What the node ends with at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum After {
    /// Known ahead: the digest, the size when known, and where they come from.
    Known {
        /// Hex SHA-256.
        sha256: String,
        /// Size in bytes; None when the source does not say.
        size: Option<u64>,
        /// Where the new content comes from (`withheld` text).
        note: String,
    },
    /// Not known ahead: who writes it, or why it could not be learnt.
    Unknown(String),
}

/// The change id every entry names.
const CHANGE: &str = super::ID;

/// One diff entry of the upgrade (pure).
pub(crate) fn entry(path: &str, before: Option<&Sum>, after: &After) -> pb::FileDiff {
    let sha = |s: &str| format!("sha256:{s}");
    let (after_sha256, after_size, withheld, after_unknown) = match after {
        After::Known { sha256, size, note } => {
            let note = match size {
                Some(_) => note.clone(),
                None => format!("{note}; the source gives no size ahead"),
            };
            (sha(sha256), size.unwrap_or(0), note, false)
        }
        After::Unknown(why) => (String::new(), 0, why.clone(), true),
    };
    pb::FileDiff {
        path: path.to_string(),
        operation: if before.is_some() {
            ChangeOperation::Update
        } else {
            ChangeOperation::Create
        } as i32,
        change_ids: vec![CHANGE.to_string()],
        before_sha256: before.map_or(String::new(), |b| sha(&b.sha256)),
        after_sha256,
        before_size: before.map_or(0, |b| b.size),
        after_size,
        unified: String::new(),
        withheld,
        after_unknown,
    }
}

/// The diff entries of `up` on the node at `root`, sorted by path. Errors: a file that
/// can not be read (naming it), or the `url` source's client can not be made.
pub(crate) fn upgrade_diffs(
    up: &Upgrade,
    config: &Config,
    root: &Sysroot,
) -> Result<Vec<pb::FileDiff>, String> {
    let kc = &config.kubernetes;
    let mut out = Vec::new();
    let client = match kc.source {
        SourceKind::Url => Some(quick_client(kc)?),
        _ => None,
    };
    for bin in kc.binaries() {
        let path = kc.bin_path(bin);
        let before = sum_of(root, &path)?;
        let after = match &client {
            Some(c) => published(c, kc, up, bin),
            None => After::Unknown(package_note(kc, up, bin)),
        };
        out.push(entry(&path, before.as_ref(), &after));
        if let (Some(_), Some(now)) = (&client, &before) {
            // the roll-back's copy of the binary replaced ([`upgrade`]'s install_file)
            let backup = format!("{}/{bin}-{}", kc.backup_dir.trim_end_matches('/'), up.from);
            let kept = After::Known {
                sha256: now.sha256.clone(),
                size: Some(now.size),
                note: format!(
                    "binary: the previous {path} ({}), kept for the roll-back",
                    up.from
                ),
            };
            out.push(entry(&backup, sum_of(root, &backup)?.as_ref(), &kept));
        }
    }
    for (path, why) in rewritten(up, config, root) {
        let before = sum_of(root, &path)?;
        out.push(entry(
            &path,
            before.as_ref(),
            &After::Unknown(why.to_string()),
        ));
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The files `kubeadm upgrade node` rewrites, with why their after side is not known.
fn rewritten(up: &Upgrade, config: &Config, root: &Sysroot) -> Vec<(String, &'static str)> {
    let mut out = vec![
        (config.kubelet.config_path.clone(), REWRITTEN_BY_KUBEADM),
        (config.kubelet.flags_path.clone(), FLAGS_MAY_BE_REWRITTEN),
    ];
    if up.control_plane {
        let dir = super::manifests_dir(config);
        let components = CONTROL_PLANE_COMPONENTS.iter().chain(&["etcd"]);
        for c in components {
            let path = format!("{dir}/{c}.yaml");
            // kubeadm rewrites the manifests that exist (etcd's only with a local etcd)
            if matches!(root.stat(&path), Ok(Some(_))) {
                out.push((path, REWRITTEN_BY_KUBEADM));
            }
        }
    }
    out
}

/// A client for the checksum `GET`s and size `HEAD`s, with a short timeout.
fn quick_client(kc: &k8s::KubernetesConfig) -> Result<k8s::fetch::Client, String> {
    let quick = k8s::KubernetesConfig {
        timeout_secs: kc.timeout_secs.min(ASK_TIMEOUT_SECS),
        ..kc.clone()
    };
    k8s::fetch::Client::new(&quick).map_err(|e| e.to_string())
}

/// What `bin` of `up.to` will be, as the `url` source publishes it: the digest of its
/// `.sha256`, the size of a `HEAD` of the binary.
fn published(
    client: &k8s::fetch::Client,
    kc: &k8s::KubernetesConfig,
    up: &Upgrade,
    bin: &str,
) -> After {
    let url = k8s::source::binary_url(kc, up.to, bin);
    let sum_url = k8s::source::checksum_url(&url);
    let shown = k8s::fetch::redact_url(&sum_url);
    let sha256 = match client.get(&sum_url, 4096) {
        Ok(text) => match k8s::source::parse_checksum(&String::from_utf8_lossy(&text)) {
            Some(s) => s,
            None => return After::Unknown(format!("{shown} holds no SHA-256: not known ahead")),
        },
        Err(e) => return After::Unknown(format!("{e}: not known ahead")),
    };
    // a mirror that gives no size (or fails the HEAD) leaves the digest, which the
    // download is checked against, as the after side
    let size = client.size(&url).ok().flatten();
    let checked = if kc.verify_signatures {
        "its sigstore signature and this SHA-256"
    } else {
        "this SHA-256 only (kubernetes.verify_signatures = false)"
    };
    After::Known {
        sha256,
        size,
        note: format!(
            "binary: {bin} {} from {}, SHA-256 from {shown}; the download is verified against {checked} before anything is installed",
            up.to,
            k8s::fetch::redact_url(&url)
        ),
    }
}

/// Who installs `bin` for a package source.
fn package_note(kc: &k8s::KubernetesConfig, up: &Upgrade, bin: &str) -> String {
    let spec = match kc.source {
        SourceKind::Apt => format!("apt ({})", k8s::source::apt_spec(kc, bin, up.to)),
        SourceKind::Dnf => format!("dnf ({})", k8s::source::dnf_spec(bin, up.to)),
        _ => "no source".into(),
    };
    format!("binary: installed by {spec}, content not known ahead")
}

/// The SHA-256 and size of the regular file at `path` (None: absent), streamed.
fn sum_of(root: &Sysroot, path: &str) -> Result<Option<Sum>, String> {
    let Some(mut f) = root
        .open_read(path)
        .map_err(|e| format!("reading {path} for the diff: {e}"))?
    else {
        return Ok(None);
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; k8s::fetch::STREAM_BUFFER];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading {path} for the diff: {e}")),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok(Some(Sum {
        sha256: hex::encode(hasher.finalize()),
        size,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_names_both_sides_or_says_the_after_is_not_known() {
        let now = Sum {
            sha256: "ab".repeat(32),
            size: 80,
        };
        let known = After::Known {
            sha256: "cd".repeat(32),
            size: Some(90),
            note: "binary: kubelet".into(),
        };
        let e = entry("/usr/bin/kubelet", Some(&now), &known);
        assert_eq!(e.operation, ChangeOperation::Update as i32);
        assert_eq!(e.change_ids, ["kubernetes.version"]);
        assert_eq!(e.before_sha256, format!("sha256:{}", "ab".repeat(32)));
        assert_eq!((e.before_size, e.after_size), (80, 90));
        assert_eq!(e.after_sha256, format!("sha256:{}", "cd".repeat(32)));
        assert!(!e.after_unknown);

        let no_size = After::Known {
            sha256: "cd".repeat(32),
            size: None,
            note: "binary: kubectl".into(),
        };
        let e = entry("/usr/bin/kubectl", None, &no_size);
        assert_eq!(e.operation, ChangeOperation::Create as i32);
        assert_eq!(e.before_sha256, "");
        assert_eq!(e.after_size, 0);
        assert_eq!(
            e.withheld,
            "binary: kubectl; the source gives no size ahead"
        );

        let e = entry(
            "/var/lib/kubelet/config.yaml",
            Some(&now),
            &After::Unknown(REWRITTEN_BY_KUBEADM.into()),
        );
        assert!(e.after_unknown);
        assert_eq!((e.after_sha256.as_str(), e.after_size), ("", 0));
        assert_eq!(e.withheld, REWRITTEN_BY_KUBEADM);
    }

    #[test]
    fn a_package_source_installs_binaries_not_known_ahead() {
        let v = |s: &str| inplace_wire::k8s_version::Version::parse(s).unwrap();
        let up = Upgrade {
            from: v("v1.34.3"),
            to: v("v1.35.2"),
            control_plane: false,
            kubelet_files: vec![],
        };
        let apt = k8s::KubernetesConfig {
            source: SourceKind::Apt,
            ..Default::default()
        };
        assert_eq!(
            package_note(&apt, &up, "kubelet"),
            "binary: installed by apt (kubelet=1.35.2-1.1), content not known ahead"
        );
        let dnf = k8s::KubernetesConfig {
            source: SourceKind::Dnf,
            ..Default::default()
        };
        assert_eq!(
            package_note(&dnf, &up, "kubeadm"),
            "binary: installed by dnf (kubeadm-1.35.2), content not known ahead"
        );
    }
}
