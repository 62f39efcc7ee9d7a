//! The agent config's `[kubernetes]` table: where the binaries of a Kubernetes version
//! come from and how they are fetched. Documented key by key in `packaging/config.toml`.

use serde::Deserialize;

/// Where the kubeadm, kubelet and kubectl binaries of the target version come from.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// Not configured: version changes are not covered.
    #[default]
    None,
    /// The node's apt, the packages pinned to the version (`kubeadm=1.35.2-1.1`).
    Apt,
    /// The node's dnf, the packages pinned to the version (`kubeadm-1.35.2`).
    Dnf,
    /// A mirror of the upstream release layout (`url` template, `https` only), each
    /// binary verified against upstream's sigstore signature (`.sig`, `.cert`) and its
    /// `.sha256` file.
    Url,
}

/// `[kubernetes]`: Kubernetes version upgrades.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Where the binaries come from: `none` (default), `apt`, `dnf` or `url`.
    pub source: SourceKind,
    /// URL template of one binary for `source = "url"`, with `{version}` (`v1.35.2`),
    /// `{arch}` and `{binary}`; the checksum, signature and certificate are at the same
    /// URL plus `.sha256`, `.sig` and `.cert`, as in the upstream layout
    /// `https://dl.k8s.io/release/{version}/bin/linux/{arch}/{binary}`. `https://` only
    /// (refused at config load otherwise); a redirect to `http` fails the download.
    pub url: String,
    /// Architecture in the URL (`amd64`, `arm64`); empty: the agent's own.
    pub arch: String,
    /// Directory the binaries are installed in (node path).
    pub bin_dir: String,
    /// Also upgrade kubectl (the upgrade guide upgrades it with the kubelet).
    pub kubectl: bool,
    /// Node directory the replaced binaries are kept in (`<binary>-<old version>`).
    pub backup_dir: String,
    /// Static Pod manifests of a control-plane node.
    pub manifests_dir: String,
    /// PEM CA bundle (a host path) trusted for `https` downloads instead of the
    /// built-in web PKI roots; empty: the built-in roots.
    pub ca_bundle: String,
    /// HTTP(S) proxy for downloads (`http://proxy:3128`); empty: none.
    pub proxy: String,
    /// Timeout of one download or checksum request, in seconds.
    pub timeout_secs: u64,
    /// Largest binary downloaded, in bytes (the kubelet is about 80 MiB).
    pub max_download_bytes: u64,
    /// Allow going to a lower version (the skew policy supports upgrades only).
    pub allow_downgrade: bool,
    /// Package revision for `apt` (`1.35.2-<revision>`, pkgs.k8s.io uses `1.1`).
    pub package_revision: String,
    /// `url` source: require upstream's sigstore signature of each binary (default
    /// true). `false` is the explicit opt-out: binaries are then checked only against
    /// the mirror's own `.sha256`, which a mirror serving another binary also serves;
    /// it is logged at each download and named in coverage reasons.
    pub verify_signatures: bool,
    /// The identity (certificate SAN) that must have signed the binaries; upstream's:
    /// [`signature::DEFAULT_IDENTITY`](super::signature::DEFAULT_IDENTITY).
    pub signature_identity: String,
    /// The OIDC issuer of that identity in the certificate; upstream's:
    /// [`signature::DEFAULT_ISSUER`](super::signature::DEFAULT_ISSUER).
    pub signature_issuer: String,
    /// PEM file (a host path) of the Fulcio root and intermediate certificates the
    /// signing certificates must chain to: the trust anchor.
    pub fulcio_roots: String,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            source: SourceKind::None,
            url: String::new(),
            arch: String::new(),
            bin_dir: "/usr/bin".into(),
            kubectl: true,
            backup_dir: "/var/lib/inplaced-kubernetes/previous".into(),
            manifests_dir: "/etc/kubernetes/manifests".into(),
            ca_bundle: String::new(),
            proxy: String::new(),
            timeout_secs: 300,
            max_download_bytes: 256 << 20,
            allow_downgrade: false,
            package_revision: "1.1".into(),
            verify_signatures: true,
            signature_identity: super::signature::DEFAULT_IDENTITY.into(),
            signature_issuer: super::signature::DEFAULT_ISSUER.into(),
            fulcio_roots: super::signature::DEFAULT_FULCIO_ROOTS.into(),
        }
    }
}

impl KubernetesConfig {
    /// Checks the keys at config load; the error names the key and the fix. `url` must
    /// be `https://` (a plain-HTTP mirror's binaries would be installed 0755 root), and
    /// with signatures required the trust anchor keys must be set.
    pub fn validate(&self) -> Result<(), String> {
        let url = self.url.trim();
        if !url.is_empty()
            && !url
                .get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        {
            return Err(format!(
                "kubernetes.url: {:?} is not an https:// URL; Kubernetes binaries are downloaded over https only (give the mirror's https URL, and kubernetes.ca_bundle if it has a private CA)",
                super::fetch::redact_url(url)
            ));
        }
        if self.verify_signatures {
            for (key, value) in [
                ("signature_identity", &self.signature_identity),
                ("signature_issuer", &self.signature_issuer),
                ("fulcio_roots", &self.fulcio_roots),
            ] {
                if value.trim().is_empty() {
                    return Err(format!(
                        "kubernetes.{key} is empty; it is needed to verify the binaries' signatures (remove the key for upstream's value, or set kubernetes.verify_signatures = false to install binaries checked only against the mirror's .sha256)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The architecture in download URLs: `arch`, or the agent's own in Go's naming.
    pub fn arch(&self) -> String {
        if !self.arch.is_empty() {
            return self.arch.clone();
        }
        match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64le",
            other => other,
        }
        .to_string()
    }

    /// The binaries an upgrade installs, in the order of the steps: kubeadm first, then
    /// the kubelet (and kubectl).
    pub fn binaries(&self) -> Vec<&'static str> {
        let mut b = vec!["kubeadm", "kubelet"];
        if self.kubectl {
            b.push("kubectl");
        }
        b
    }

    /// Node path of `binary`.
    pub fn bin_path(&self, binary: &str) -> String {
        format!("{}/{binary}", self.bin_dir.trim_end_matches('/'))
    }
}
