//! The sources of a version's binaries as pure functions: download URLs of the release
//! layout, and the package manager command lines.
//!
//! The package steps follow the kubeadm upgrade guide
//! (<https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/upgrading-linux-nodes/>):
//! apt `apt-mark unhold` → `apt-get install -y kubeadm=<v>-<rev>` → `apt-mark hold`,
//! dnf `dnf install -y kubeadm-<v> --disableexcludes=kubernetes`; the hold (apt) or the
//! versionlock (dnf) is put back only on the packages that had one.

use super::Version;
use super::config::KubernetesConfig;

/// The URL of `binary` of `version` from the `url` template.
pub(crate) fn binary_url(config: &KubernetesConfig, version: Version, binary: &str) -> String {
    config
        .url
        .replace("{version}", &version.to_string())
        .replace("{arch}", &config.arch())
        .replace("{binary}", binary)
}

/// The URL of the checksum file of a binary URL (the upstream layout's `.sha256`).
pub(crate) fn checksum_url(binary_url: &str) -> String {
    format!("{binary_url}.sha256")
}

/// The URL of the sigstore signature of a binary URL (the upstream layout's `.sig`).
pub(crate) fn signature_url(binary_url: &str) -> String {
    format!("{binary_url}.sig")
}

/// The URL of the signing certificate of a binary URL (the upstream layout's `.cert`).
pub(crate) fn certificate_url(binary_url: &str) -> String {
    format!("{binary_url}.cert")
}

/// The hex SHA-256 in a checksum file: upstream's hold just the hex; `sha256sum`'s form
/// (`<hex>  <name>`) is accepted too. None when it holds no 64-digit hex.
pub(crate) fn parse_checksum(text: &str) -> Option<String> {
    let word = text.split_whitespace().next()?;
    (word.len() == 64 && word.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| word.to_ascii_lowercase())
}

/// Argv of one command.
pub(crate) type Argv = Vec<String>;

fn argv(words: &[&str]) -> Argv {
    words.iter().map(|s| s.to_string()).collect()
}

/// The apt package spec of `pkg` at `version` (`kubeadm=1.35.2-1.1`).
pub(crate) fn apt_spec(config: &KubernetesConfig, pkg: &str, version: Version) -> String {
    format!("{pkg}={}-{}", version.bare(), config.package_revision)
}

/// The dnf package spec of `pkg` at `version` (`kubeadm-1.35.2`).
pub(crate) fn dnf_spec(pkg: &str, version: Version) -> String {
    format!("{pkg}-{}", version.bare())
}

/// The apt commands that install `pkgs` at `version`, releasing and putting back the
/// holds of those among them in `held`.
pub(crate) fn apt_install(
    config: &KubernetesConfig,
    pkgs: &[&str],
    version: Version,
    held: &[String],
) -> Vec<Argv> {
    let held: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| held.iter().any(|h| h == p))
        .collect();
    let mut out = Vec::new();
    if !held.is_empty() {
        out.push([argv(&["apt-mark", "unhold"]), argv(&held)].concat());
    }
    let mut install = argv(&[
        "apt-get",
        "install",
        "-y",
        "--allow-downgrades",
        "-o",
        "Dpkg::Options::=--force-confold",
    ]);
    install.extend(pkgs.iter().map(|p| apt_spec(config, p, version)));
    out.push(install);
    if !held.is_empty() {
        out.push([argv(&["apt-mark", "hold"]), argv(&held)].concat());
    }
    out
}

/// The dnf commands that install `pkgs` at `version`, deleting and putting back the
/// versionlocks of those among them in `locked`.
pub(crate) fn dnf_install(pkgs: &[&str], version: Version, locked: &[String]) -> Vec<Argv> {
    let locked: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| locked.iter().any(|h| h == p))
        .collect();
    let mut out = Vec::new();
    if !locked.is_empty() {
        out.push([argv(&["dnf", "versionlock", "delete"]), argv(&locked)].concat());
    }
    let mut install = argv(&["dnf", "install", "-y", "--disableexcludes=kubernetes"]);
    install.extend(pkgs.iter().map(|p| dnf_spec(p, version)));
    out.push(install);
    if !locked.is_empty() {
        out.push([argv(&["dnf", "versionlock", "add"]), argv(&locked)].concat());
    }
    out
}

/// The packages `apt-mark showhold` lists.
pub(crate) fn parse_holds(out: &str) -> Vec<String> {
    out.split_whitespace().map(str::to_string).collect()
}

/// The packages `dnf versionlock list` lists (`kubeadm-0:1.34.3-150500.1.1.*`).
pub(crate) fn parse_versionlocks(out: &str, pkgs: &[&str]) -> Vec<String> {
    pkgs.iter()
        .filter(|p| {
            out.lines().any(|l| {
                l.trim()
                    .strip_prefix(**p)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
        })
        .map(|p| p.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn urls_follow_the_template() {
        let c = KubernetesConfig {
            url: "https://m.example/release/{version}/bin/linux/{arch}/{binary}".into(),
            arch: "arm64".into(),
            ..Default::default()
        };
        let u = binary_url(&c, v("1.35.2"), "kubelet");
        assert_eq!(
            u,
            "https://m.example/release/v1.35.2/bin/linux/arm64/kubelet"
        );
        assert_eq!(
            checksum_url(&u),
            "https://m.example/release/v1.35.2/bin/linux/arm64/kubelet.sha256"
        );
    }

    #[test]
    fn checksum_files() {
        let h = "a".repeat(64);
        assert_eq!(parse_checksum(&format!("{h}\n")), Some(h.clone()));
        assert_eq!(parse_checksum(&format!("{h}  kubelet\n")), Some(h));
        assert_eq!(parse_checksum("<html>not found</html>"), None);
    }

    #[test]
    fn apt_keeps_holds_as_they_were() {
        let c = KubernetesConfig::default();
        let cmds = apt_install(
            &c,
            &["kubelet", "kubectl"],
            v("1.35.2"),
            &["kubelet".into()],
        );
        let lines: Vec<String> = cmds.iter().map(|a| a.join(" ")).collect();
        assert_eq!(
            lines,
            vec![
                "apt-mark unhold kubelet",
                "apt-get install -y --allow-downgrades -o Dpkg::Options::=--force-confold kubelet=1.35.2-1.1 kubectl=1.35.2-1.1",
                "apt-mark hold kubelet",
            ]
        );
        assert_eq!(apt_install(&c, &["kubeadm"], v("1.35.2"), &[]).len(), 1);
    }

    #[test]
    fn dnf_keeps_versionlocks_as_they_were() {
        let locked = parse_versionlocks(
            "Last metadata expiration check: 0:01:02 ago\nkubeadm-0:1.34.3-150500.1.1.*\n",
            &["kubeadm", "kubelet"],
        );
        assert_eq!(locked, vec!["kubeadm"]);
        let lines: Vec<String> = dnf_install(&["kubeadm"], v("1.35.2"), &locked)
            .iter()
            .map(|a| a.join(" "))
            .collect();
        assert_eq!(
            lines,
            vec![
                "dnf versionlock delete kubeadm",
                "dnf install -y --disableexcludes=kubernetes kubeadm-1.35.2",
                "dnf versionlock add kubeadm",
            ]
        );
    }
}
