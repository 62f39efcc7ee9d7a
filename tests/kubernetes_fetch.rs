//! The `url` source's downloads are authentic, https only and streamed: the real daemon
//! on a copy of the ubuntu fixture, a loopback HTTPS mirror of the release layout whose
//! binaries are signed as upstream signs them (cosign keyless: `.sig` and `.cert` beside
//! each binary), with a test Fulcio (root and intermediate) as the configured trust
//! anchor.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;

use common::k8s::{
    Fulcio, IDENTITY, ISSUER, Leaf, Mirror, OID_ISSUER_V1, PlainHttp, binaries, install_standins,
    kubectl, kubelet, url_config,
};
use common::{Node, apply, change, coverage, snapshot};
use inplace_wire::pb::Phase;
use rcgen::SanType;

const TO_135: &str = "kubernetes:\n  version: v1.35.2\n";

fn node_at(version: &str, config: &str) -> Node {
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, version);
    std::fs::write(&node.config, config).unwrap();
    node.start();
    node
}

/// Applies v1.35.2 and asserts it failed before anything changed, with `why` in the
/// message; returns the message.
async fn refused(node: &Node, why: &[&str]) -> String {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let id = format!("k8s-refused-{}", SEQ.fetch_add(1, Ordering::SeqCst));
    let before = snapshot(&node.root);
    let op = apply(node, TO_135, &id).await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    for w in why {
        assert!(op.message.contains(w), "{w:?} not in {}", op.message);
    }
    assert!(op.message.contains("nothing was changed"), "{}", op.message);
    assert_eq!(snapshot(&node.root), before);
    assert!(node.actions().is_empty(), "{:?}", node.actions());
    op.message
}

/// A kubelet that is not upstream's, with a matching `.sha256` of its own.
fn evil_kubelet(mirror: &Mirror) -> Vec<u8> {
    let evil = b"#!/bin/sh\n# not upstream's kubelet\necho Kubernetes v1.35.2\n".to_vec();
    let path = mirror.path("v1.35.2", "kubelet");
    let mut f = mirror.files.lock().unwrap();
    f.insert(
        format!("{path}.sha256"),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&evil)).into_bytes(),
    );
    f.insert(path, evil.clone());
    evil
}

#[tokio::test]
async fn correctly_signed_binaries_install() {
    // upstream's form is tests/kubernetes.rs; here: the deprecated issuer extension, a
    // URI identity of another signer configured explicitly, and a patch release
    let mirror = Mirror::start();
    let legacy = Leaf {
        issuer: Some((OID_ISSUER_V1, ISSUER.as_bytes().to_vec())),
        ..Leaf::upstream()
    };
    for (name, bytes) in binaries("v1.35.2") {
        mirror.publish("v1.35.2", name, &bytes, &legacy);
    }
    let node = node_at("v1.34.3", &url_config(&mirror));
    let op = apply(&node, TO_135, "legacy-issuer").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(
        std::fs::read(node.path("/usr/bin/kubelet")).unwrap(),
        kubelet("kubelet", "v1.35.2")
    );

    let workflow =
        "https://github.com/acme/k8s-build/.github/workflows/release.yml@refs/tags/v1.34.5";
    let gha = "https://token.actions.githubusercontent.com";
    let own = Leaf {
        sans: vec![SanType::URI(workflow.try_into().unwrap())],
        ..Leaf::identity(IDENTITY, gha)
    };
    for (name, bytes) in binaries("v1.34.5") {
        mirror.publish("v1.34.5", name, &bytes, &own);
    }
    let config = format!(
        "{}signature_identity = \"{workflow}\"\nsignature_issuer = \"{gha}\"\n",
        url_config(&mirror)
    );
    let node = node_at("v1.34.3", &config);
    let r = coverage(&node, "kubernetes: {version: v1.34.5}\n").await;
    let c = change(&r, "kubernetes.version");
    assert!(c.covered, "{}", c.reason);
    assert!(
        c.reason.contains(workflow) && c.reason.contains(gha),
        "{}",
        c.reason
    );
    let op = apply(&node, "kubernetes: {version: v1.34.5}\n", "own-signer").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(
        std::fs::read(node.path("/usr/bin/kubectl")).unwrap(),
        kubectl("v1.34.5")
    );
}

#[tokio::test]
async fn another_binary_with_its_own_checksum_fails_verification() {
    // its upstream signature and certificate: the signature is not over these bytes
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    evil_kubelet(&mirror);
    let node = node_at("v1.34.3", &url_config(&mirror));
    refused(
        &node,
        &[
            "kubelet.sig: the signature is not krel-staging@k8s-releng-prod.iam.gserviceaccount.com's over the downloaded bytes",
        ],
    )
    .await;

    // signed with the right identity by a Fulcio that is not the configured one
    let evil = evil_kubelet(&mirror);
    let rogue = Fulcio::new("rogue");
    let (cert, sig) = rogue.sign(&evil, &Leaf::upstream());
    let path = mirror.path("v1.35.2", "kubelet");
    mirror
        .files
        .lock()
        .unwrap()
        .extend([(format!("{path}.cert"), cert), (format!("{path}.sig"), sig)]);
    refused(
        &node,
        &[
            "kubelet.cert: the certificate is not issued by the Fulcio roots in",
            "(kubernetes.fulcio_roots)",
        ],
    )
    .await;

    // a signature file that is not one, beside upstream's binary and certificate
    mirror.publish(
        "v1.35.2",
        "kubelet",
        &kubelet("kubelet", "v1.35.2"),
        &Leaf::upstream(),
    );
    mirror
        .files
        .lock()
        .unwrap()
        .insert(format!("{path}.sig"), b"<html>signature</html>".to_vec());
    refused(&node, &["kubelet.sig: not base64"]).await;

    // no signature at all: not covered (coverage asks for the files)
    for ext in ["sig", "cert"] {
        mirror
            .files
            .lock()
            .unwrap()
            .remove(&format!("{path}.{ext}"));
    }
    evil_kubelet(&mirror);
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(!c.covered);
    assert!(
        c.reason
            .contains("the signature of kubelet v1.35.2 is not available")
            && c.reason.contains("404"),
        "{}",
        c.reason
    );
}

#[tokio::test]
async fn a_certificate_of_another_identity_or_issuer_fails() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let node = node_at("v1.34.3", &url_config(&mirror));
    let bytes = kubelet("kubelet", "v1.35.2");
    let cases = [
        // the identity of upstream's images, not of its binaries
        (
            Leaf::identity("krel-trust@k8s-releng-prod.iam.gserviceaccount.com", ISSUER),
            "the certificate is for krel-trust@k8s-releng-prod.iam.gserviceaccount.com, not krel-staging@k8s-releng-prod.iam.gserviceaccount.com (kubernetes.signature_identity)",
        ),
        // a longer name that starts with the identity
        (
            Leaf::identity(&format!("{IDENTITY}.evil.example"), ISSUER),
            "(kubernetes.signature_identity)",
        ),
        // the right identity from another OIDC issuer
        (
            Leaf::identity(IDENTITY, "https://issuer.evil.example"),
            "the certificate's OIDC issuer is https://issuer.evil.example, not https://accounts.google.com (kubernetes.signature_issuer)",
        ),
        // no issuer extension
        (
            Leaf {
                issuer: None,
                ..Leaf::upstream()
            },
            "OIDC issuer is none (no Fulcio issuer extension)",
        ),
        // not a code-signing certificate
        (
            Leaf {
                code_signing: false,
                ..Leaf::upstream()
            },
            "the certificate is not for code signing",
        ),
    ];
    for (leaf, why) in cases {
        mirror.publish("v1.35.2", "kubelet", &bytes, &leaf);
        refused(&node, &["kubelet.cert: ", why]).await;
    }
    // the same bytes signed as upstream signs install (the cases above can pass)
    mirror.publish("v1.35.2", "kubelet", &bytes, &Leaf::upstream());
    let op = apply(&node, TO_135, "k8s-ok").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
}

#[test]
fn a_url_that_is_not_https_is_refused_at_config_load() {
    let node = Node::new("ubuntu-2404-grub");
    let with = |url: &str| format!("[kubernetes]\nsource = \"url\"\nurl = \"{url}\"\n");
    for (config, key) in [
        (
            with("http://127.0.0.1:8080/release/{version}/bin/linux/{arch}/{binary}"),
            "kubernetes.url",
        ),
        (
            with("HTTP://mirror.example/release/{version}/{binary}"),
            "kubernetes.url",
        ),
        (
            with("dl.k8s.io/release/{version}/bin/linux/{arch}/{binary}"),
            "kubernetes.url",
        ),
        (with("ftp://mirror.example/{binary}"), "kubernetes.url"),
        (
            format!(
                "{}fulcio_roots = \"\"\n",
                with("https://dl.k8s.io/{binary}")
            ),
            "kubernetes.fulcio_roots is empty",
        ),
        (
            format!(
                "{}signature_identity = \"\"\n",
                with("https://dl.k8s.io/{binary}")
            ),
            "kubernetes.signature_identity is empty",
        ),
    ] {
        std::fs::write(&node.config, &config).unwrap();
        let out = node.daemon().output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{config}: {err}");
        assert!(err.contains(key), "{config}: {err}");
        if key == "kubernetes.url" {
            assert!(err.contains("https only"), "{err}");
        }
    }
    // the refusal never echoes a mirror's credentials
    std::fs::write(
        &node.config,
        with("http://bob:s3cret@mirror.example/{binary}"),
    )
    .unwrap();
    let out = node.daemon().output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kubernetes.url") && !err.contains("s3cret"),
        "{err}"
    );
}

#[tokio::test]
async fn a_redirect_to_http_fails_the_download() {
    let mirror = Mirror::start();
    let plain = PlainHttp::start();
    mirror.release("v1.35.2");
    let node = node_at("v1.34.3", &url_config(&mirror));
    let kubelet_path = mirror.path("v1.35.2", "kubelet");
    let to_plain = |path: &str| {
        mirror.redirects.lock().unwrap().insert(
            path.to_string(),
            format!("http://127.0.0.1:{}{path}", plain.port),
        );
    };
    // the binary (coverage asks only for its companions, the download fails)
    to_plain(&kubelet_path);
    refused(&node, &["kubelet: refused http://127.0.0.1:", "https only"]).await;
    // its signature certificate
    mirror.redirects.lock().unwrap().clear();
    to_plain(&format!("{kubelet_path}.cert"));
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(
        !c.covered && c.reason.contains("https only"),
        "{}",
        c.reason
    );
    // its checksum
    mirror.redirects.lock().unwrap().clear();
    to_plain(&format!("{kubelet_path}.sha256"));
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(
        !c.covered && c.reason.contains("https only"),
        "{}",
        c.reason
    );
    assert_eq!(
        plain.connections.load(Ordering::SeqCst),
        0,
        "plain http reached"
    );
    // a redirect to https on the mirror itself is followed
    mirror.redirects.lock().unwrap().clear();
    let moved = format!("/moved{kubelet_path}");
    let body = mirror.files.lock().unwrap()[&kubelet_path].clone();
    mirror.files.lock().unwrap().insert(moved.clone(), body);
    mirror.redirects.lock().unwrap().insert(
        kubelet_path.clone(),
        format!("https://127.0.0.1:{}{moved}", mirror.port),
    );
    let op = apply(&node, TO_135, "k8s-moved").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(
        mirror
            .requests
            .lock()
            .unwrap()
            .contains(&format!("GET {moved}")),
        "the redirect was not followed"
    );
}

/// Peak resident set of `pid` (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn downloads_stream_through_a_root_only_staging_directory() {
    const SIZE: usize = 64 << 20;
    let mirror = Mirror::start();
    let mut bins = mirror.release("v1.35.2");
    // a 64 MiB kubectl (never run by the stand-ins)
    let mut big = kubectl("v1.35.2");
    big.extend(std::iter::repeat_n(b'#', SIZE - big.len()));
    mirror.publish("v1.35.2", "kubectl", &big, &Leaf::upstream());
    bins.insert("kubectl", big.clone());
    let node = node_at("v1.34.3", &url_config(&mirror));
    let pid = node.pid().unwrap();
    let r = coverage(&node, TO_135).await;
    assert!(change(&r, "kubernetes.version").covered);
    let before = peak_rss_kib(pid);
    let op = apply(&node, TO_135, "k8s-big").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let grew = peak_rss_kib(pid).saturating_sub(before);
    eprintln!("peak RSS grew by {grew} KiB for a 64 MiB binary");
    // holding the binary in memory grows the peak by at least 64 MiB
    assert!(
        grew < 24 << 10,
        "peak RSS grew by {grew} KiB for a 64 MiB binary"
    );
    for (name, bytes) in &bins {
        assert!(
            std::fs::read(node.path(&format!("/usr/bin/{name}"))).unwrap() == *bytes,
            "{name}"
        );
    }
    let staging = node.state.join("kubernetes-staging");
    let meta = std::fs::symlink_metadata(&staging).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    assert_eq!(
        std::fs::read_dir(&staging).unwrap().count(),
        0,
        "staging emptied"
    );
    let said = format!(
        "verified kubectl v1.35.2 (SHA-256 {}, {SIZE} bytes)",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&big))
    );
    assert!(
        op.actions.iter().any(|a| a.starts_with(&said)),
        "{:?}",
        op.actions
    );
}

#[tokio::test]
async fn a_leftover_staging_file_or_a_symlinked_staging_directory_is_not_used() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let node = node_at("v1.34.3", &url_config(&mirror));
    // a symlink where the staging directory goes: refused, nothing followed
    let elsewhere = node.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let staging = node.state.join("kubernetes-staging");
    std::os::unix::fs::symlink(&elsewhere, &staging).unwrap();
    refused(&node, &["staging ", "kubernetes-staging"]).await;
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // a leftover of a crashed run (even a symlink named as a binary) is removed first
    std::fs::remove_file(&staging).unwrap();
    std::fs::create_dir(&staging).unwrap();
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = node.dir.path().join("victim");
    std::fs::write(&victim, "not to be overwritten").unwrap();
    std::os::unix::fs::symlink(&victim, staging.join("kubelet")).unwrap();
    std::fs::write(staging.join("kubeadm"), "leftover").unwrap();
    let op = apply(&node, TO_135, "k8s-after-crash").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "not to be overwritten"
    );
    let meta = std::fs::symlink_metadata(&staging).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
}

#[tokio::test]
async fn unsigned_versions_and_a_missing_trust_anchor_are_not_covered_unless_opted_out() {
    let mirror = Mirror::start();
    for (name, bytes) in binaries("v1.25.9") {
        let path = mirror.path("v1.25.9", name);
        let mut f = mirror.files.lock().unwrap();
        f.insert(
            format!("{path}.sha256"),
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)).into_bytes(),
        );
        f.insert(path, bytes);
    }
    mirror.release("v1.35.2");
    let to_125 = "kubernetes: {version: v1.25.9}\n";
    let node = node_at("v1.25.3", &url_config(&mirror));
    let r = coverage(&node, to_125).await;
    let c = change(&r, "kubernetes.version");
    assert!(!c.covered);
    assert!(
        c.reason.contains(
            "upstream signs the Kubernetes binaries from v1.26.0 on, v1.25.9 has no signatures"
        ) && c.reason.contains("kubernetes.verify_signatures = false"),
        "{}",
        c.reason
    );
    drop(node);

    // the trust anchor file missing: not covered, naming the key
    let config = url_config(&mirror).replace(&mirror.fulcio_path, "/nonexistent/fulcio.pem");
    let node = node_at("v1.34.3", &config);
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(!c.covered);
    assert!(
        c.reason
            .contains("kubernetes.fulcio_roots: /nonexistent/fulcio.pem"),
        "{}",
        c.reason
    );
    drop(node);

    // the explicit opt-out: covered, said so, and logged at the download
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.25.3");
    std::fs::write(
        &node.config,
        format!("{}verify_signatures = false\n", url_config(&mirror)),
    )
    .unwrap();
    node.log_file = Some(node.dir.path().join("log"));
    node.start();
    let r = coverage(&node, to_125).await;
    let c = change(&r, "kubernetes.version");
    assert!(c.covered, "{}", c.reason);
    assert!(
        c.reason.contains("checked only against the mirror's own .sha256, not authenticated (kubernetes.verify_signatures = false)"),
        "{}",
        c.reason
    );
    let op = apply(&node, to_125, "k8s-unsigned").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(
        node.log().contains("kubernetes.verify_signatures = false: the binaries are checked only against the mirror's own .sha256"),
        "{}",
        node.log()
    );
    let asked = mirror.requests.lock().unwrap().clone();
    assert!(
        !asked
            .iter()
            .any(|r| r.contains("v1.25.9") && (r.ends_with(".sig") || r.ends_with(".cert"))),
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_rollback_restores_a_large_binary_without_holding_it_in_memory() {
    const SIZE: usize = 64 << 20;
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    // the new kubelet reports another version: the upgrade is rolled back after the
    // kubelet was replaced
    let liar = kubelet("kubelet", "v1.35.1");
    mirror.publish("v1.35.2", "kubelet", &liar, &Leaf::upstream());
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    // the node's kubelet is 64 MiB (the script exits before the padding)
    let mut old = kubelet("kubelet", "v1.34.3");
    old.extend_from_slice(b"exit 0\n");
    old.extend(std::iter::repeat_n(b'#', SIZE - old.len()));
    std::fs::write(node.path("/usr/bin/kubelet"), &old).unwrap();
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    node.start();
    let pid = node.pid().unwrap();
    let r = coverage(&node, TO_135).await;
    assert!(change(&r, "kubernetes.version").covered);
    let before_rss = peak_rss_kib(pid);
    let before = snapshot(&node.root);
    let op = apply(&node, TO_135, "k8s-liar").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        op.message
            .contains("the installed kubelet reports v1.35.1, not the target v1.35.2"),
        "{}",
        op.message
    );
    assert!(
        op.actions.iter().any(|a| a
            == "saved the previous /usr/bin/kubelet as /var/lib/inplaced-kubernetes/previous/kubelet-v1.34.3"),
        "{:?}",
        op.actions
    );
    assert!(std::fs::read(node.path("/usr/bin/kubelet")).unwrap() == old);
    assert_eq!(snapshot(&node.root), before);
    let grew = peak_rss_kib(pid).saturating_sub(before_rss);
    eprintln!("peak RSS grew by {grew} KiB saving and restoring a 64 MiB kubelet");
    assert!(
        grew < 24 << 10,
        "peak RSS grew by {grew} KiB for a 64 MiB kubelet"
    );
}

#[tokio::test]
async fn a_binary_over_the_size_limit_fails_the_streamed_download() {
    let mirror = Mirror::start();
    let bins = mirror.release("v1.35.2");
    let limit = bins["kubeadm"].len() - 1;
    let config = format!("{}max_download_bytes = {limit}\n", url_config(&mirror));
    let node = node_at("v1.34.3", &config);
    refused(
        &node,
        &[
            "kubeadm: ",
            &format!("(limit {limit} bytes, kubernetes.max_download_bytes)"),
        ],
    )
    .await;
    // the staging file of the refused download is gone
    let staging = node.state.join("kubernetes-staging");
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
}

/// A signature covers bytes, not a file name or a version: a mirror replaying upstream's
/// genuinely signed files of another release or another binary (with their own `.sig`,
/// `.cert` and `.sha256`) at a binary's path gets nothing installed for good. Each
/// installed binary must report the target before the kubelet runs on it, so the
/// operation rolls back without a kubelet restart, naming the binary and the version
/// (break-it finding: v1.26.0's kubectl and kubeadm were installed as kubectl, and an
/// older kubelet was restarted before its version was checked).
#[tokio::test]
async fn signed_bytes_of_another_release_or_binary_are_not_installed() {
    for (name, bytes, want) in [
        (
            "kubectl",
            kubectl("v1.26.0"),
            "the installed kubectl reports v1.26.0, not the target v1.35.2",
        ),
        (
            "kubectl",
            common::k8s::kubeadm("v1.35.2"),
            "/usr/bin/kubectl version --client: exit status: 2",
        ),
        (
            "kubelet",
            kubelet("kubelet", "v1.26.0"),
            "the installed kubelet reports v1.26.0, not the target v1.35.2",
        ),
    ] {
        let mirror = Mirror::start();
        mirror.release("v1.35.2");
        mirror.publish("v1.35.2", name, &bytes, &Leaf::upstream());
        let node = node_at("v1.34.3", &url_config(&mirror));
        let before = std::fs::read(node.path(&format!("/usr/bin/{name}"))).unwrap();
        let op = apply(&node, TO_135, "replayed").await;
        assert_eq!(op.phase, Phase::RolledBack as i32, "{name}: {}", op.message);
        assert!(op.message.contains(want), "{name}: {}", op.message);
        assert!(
            !op.actions
                .iter()
                .any(|a| a.starts_with("restarted kubelet.service") && !a.contains("undo")),
            "{name}: the kubelet ran on it: {:?}",
            op.actions
        );
        assert_eq!(
            std::fs::read(node.path(&format!("/usr/bin/{name}"))).unwrap(),
            before,
            "{name}"
        );
    }
}
