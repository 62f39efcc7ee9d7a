//! The agent's own configuration: `/etc/inplaced/config.toml` (optional; every key has a
//! default).
//!
//! ```toml
//! reboot_method = "full"    # full | kexec | auto (see RebootMethod)
//!
//! [kubelet]
//! config_path = "/var/lib/kubelet/config.yaml"
//! flags_path = "/var/lib/kubelet/kubeadm-flags.env"
//! unit = "kubelet.service"
//!
//! [sysctl]
//! drop_in = "/etc/sysctl.d/99-zz-inplaced.conf"
//!
//! [kernel_args]
//! backend = "auto"          # auto | grub | bls
//!
//! # Disruption rules for files, like OpenShift's NodeDisruptionPolicy: the first rule whose
//! # glob matches the path wins; without a match a file change has no disruption.
//! [[disruption]]
//! path = "/etc/containerd/**"
//! action = "restart"        # none | reload | restart | daemon-reload | drain | reboot
//! units = ["containerd.service"]
//!
//! [preservation]
//! hardware_bound = false    # force a preserve recommendation
//! bindings = ["licence: node-locked ISV licence (host id 0xA1B2)"]
//!
//! [history]
//! keep = 50
//! ```

use std::path::Path;

use serde::Deserialize;

use inplace_edge::listener::{IdentityKind, TcpConfig};
use inplace_wire::pb::DisruptionLevel;

/// Errors reading the config file; they name the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {error}")]
    Read {
        /// Config file path.
        path: String,
        /// OS error (part of the message).
        error: std::io::Error,
    },
    /// The file, or a directory on its way up to `/`, may be written by another user
    /// than root (or the agent's uid): nothing from it is used and the daemon does not
    /// start ([`inplace_node::trust`]).
    #[error(
        "{0}; inplaced does not start with a configuration another user could have written: fix the owner and mode (chown root:root, chmod go-w), or, for a shared directory such as /tmp, move the file to a directory only root can write"
    )]
    Untrusted(inplace_node::trust::Untrusted),
    /// The TOML is invalid or has unknown keys.
    #[error("{path}: {message}")]
    Parse {
        /// Config file path.
        path: String,
        /// Parser message with the key and position.
        message: String,
    },
}

/// Kubelet file locations and unit.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// KubeletConfiguration file the partial config is merged into.
    pub config_path: String,
    /// kubeadm's flags env file holding `KUBELET_KUBEADM_ARGS`.
    pub flags_path: String,
    /// Override files holding `KUBELET_EXTRA_ARGS`, which win over kubeadm's flags.
    pub extra_args_paths: Vec<String>,
    /// The kubelet's systemd unit.
    pub unit: String,
    /// Health endpoint checked after a kubelet restart. Unset: the kubelet's default
    /// `http://127.0.0.1:10248/healthz` with the systemd service manager, no HTTP check
    /// with `--service-manager record`.
    pub healthz_url: Option<String>,
    /// How long the kubelet may take to become healthy after a restart, in seconds.
    pub health_timeout_secs: u64,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            config_path: "/var/lib/kubelet/config.yaml".into(),
            flags_path: "/var/lib/kubelet/kubeadm-flags.env".into(),
            extra_args_paths: vec![
                "/etc/default/kubelet".into(),
                "/etc/sysconfig/kubelet".into(),
            ],
            unit: "kubelet.service".into(),
            healthz_url: None,
            health_timeout_secs: 60,
        }
    }
}

/// Sysctl persistence.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SysctlConfig {
    /// The drop-in that persists managed sysctls. It sorts after `99-*.conf` names so its
    /// values win at boot (systemd-sysctl applies files in name order, later wins).
    pub drop_in: String,
}

impl Default for SysctlConfig {
    fn default() -> Self {
        SysctlConfig {
            drop_in: "/etc/sysctl.d/99-zz-inplaced.conf".into(),
        }
    }
}

/// Which kernel-args backend to use.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// Detect from the node's boot files: rpm-ostree, then BLS entries, then GRUB.
    #[default]
    Auto,
    /// `GRUB_CMDLINE_LINUX` in `/etc/default/grub`.
    Grub,
    /// Boot Loader Specification entries.
    Bls,
}

/// Kernel-args settings.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KernelArgsConfig {
    /// Backend choice.
    pub backend: BackendChoice,
    /// Longest kernel command line the platform accepts, in bytes (the kernel's
    /// `COMMAND_LINE_SIZE`: 2048 on x86-64, longer on arm64).
    pub max_length: usize,
    /// Boot a reboot-level change once as a trial, made the default only after a healthy
    /// boot (`crate::bootloader::trial`); `false` makes it the default before the reboot.
    pub trial: bool,
}

impl Default for KernelArgsConfig {
    fn default() -> Self {
        KernelArgsConfig {
            backend: BackendChoice::Auto,
            max_length: 2048,
            trial: true,
        }
    }
}

/// A disruption action named in a rule.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// No disruption.
    None,
    /// `systemctl reload` of the units.
    Reload,
    /// `systemctl restart` of the units.
    Restart,
    /// `systemctl daemon-reload`.
    DaemonReload,
    /// The node must be drained first.
    Drain,
    /// A reboot.
    Reboot,
}

impl Action {
    /// The disruption level of this action.
    pub fn level(self) -> DisruptionLevel {
        match self {
            Action::None => DisruptionLevel::None,
            Action::Reload => DisruptionLevel::Reload,
            Action::Restart => DisruptionLevel::Restart,
            Action::DaemonReload => DisruptionLevel::DaemonReload,
            Action::Drain => DisruptionLevel::Drain,
            Action::Reboot => DisruptionLevel::Reboot,
        }
    }
}

/// A disruption rule for file paths.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DisruptionRule {
    /// Glob over absolute node paths (`*` stays within a directory, `**` crosses them).
    pub path: String,
    /// What a change of a matching file needs.
    pub action: Action,
    /// Units for reload/restart.
    #[serde(default)]
    pub units: Vec<String>,
}

/// Preservation facts declared by the operator.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PreservationConfig {
    /// Recommend preservation whatever the platform.
    pub hardware_bound: bool,
    /// Hardware bindings to report (licences, local data disks, tuned hardware).
    pub bindings: Vec<String>,
}

/// History retention.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Operations kept in history.
    pub keep: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig { keep: 50 }
    }
}

/// Drift detection.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct DriftConfig {
    /// Seconds between periodic scans (inotify triggers scans in between).
    pub interval_secs: u64,
}

impl Default for DriftConfig {
    fn default() -> Self {
        DriftConfig { interval_secs: 300 }
    }
}

/// A path glob of the agent's config (`policy.denied_paths`, `disruption[].path`),
/// compiled by the `glob` crate with `require_literal_separator`: `*`, `?` and `[...]`
/// match within one path component, `**` (a whole component) any number of components,
/// as in glob(7) and `globset` with `literal_separator`. Brace alternation (`{a,b}`), a
/// class negated with `^` and backslash escapes, which `globset` took and the `glob`
/// crate reads otherwise, are refused rather than read another way.
///
/// `globset`, which this replaced, compiles each glob to a regular expression: it and
/// `tracing-subscriber`'s `EnvFilter` were the daemon's only users of the regex engines,
/// about 0.6 MB of its 8.8 MB of code, and this kernel maps the executable whole
/// (BENCHMARKS.md, "Where the agent's RSS is").
///
/// # Errors
/// The pattern's fault (an unclosed `[`, `**` inside a component, a brace), as text.
fn compile_glob(pattern: &str) -> Result<glob::Pattern, String> {
    // each a form `globset` read one way and the `glob` crate another: refused, not
    // read differently (the test against globset checks the rest agree)
    if pattern.contains(['{', '}']) {
        return Err(format!(
            "{pattern:?}: brace alternation ({{a,b}}) is not supported; write one entry per alternative"
        ));
    }
    if pattern.contains("[^") {
        return Err(format!(
            "{pattern:?}: write a negated class as [!...], not [^...]"
        ));
    }
    if pattern.contains('\\') {
        return Err(format!(
            "{pattern:?}: backslash escapes are not supported; write [*], [?] or [[] for a literal *, ? or ["
        ));
    }
    glob::Pattern::new(pattern).map_err(|e| format!("{pattern:?}: {} (at byte {})", e.msg, e.pos))
}

/// Whether `path` matches `pattern` as [`compile_glob`] reads it.
fn glob_matches(pattern: &glob::Pattern, path: &str) -> bool {
    const OPTIONS: glob::MatchOptions = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    pattern.matches_with(path, OPTIONS)
}

/// A compiled glob, cached: the same few patterns are matched against every file of
/// every spec. None for a pattern [`Config::parse`] would have refused.
fn glob_matcher(pattern: &str) -> Option<std::sync::Arc<glob::Pattern>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Cache = Mutex<HashMap<String, Option<Arc<glob::Pattern>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    cache
        .entry(pattern.to_string())
        .or_insert_with(|| compile_glob(pattern).ok().map(Arc::new))
        .clone()
}

/// The compiled denied-path globs, each entry as itself and as `entry/**` (a path below a
/// denied directory is denied too), with the entry's index. An entry that does not
/// compile (only a config [`Config::parse`] did not check, such as a test's) is matched
/// as a literal path, so that it still denies itself and what is below it.
fn denied_set(patterns: &[String]) -> std::sync::Arc<Vec<(usize, glob::Pattern)>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Set = Arc<Vec<(usize, glob::Pattern)>>;
    static CACHE: OnceLock<Mutex<HashMap<Vec<String>, Set>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = cache.get(patterns) {
        return s.clone();
    }
    let mut set = Vec::with_capacity(patterns.len() * 2);
    for (i, d) in patterns.iter().enumerate() {
        let d = match compile_glob(d) {
            Ok(_) => d.clone(),
            Err(_) => glob::Pattern::escape(d),
        };
        let d = match d.trim_end_matches('/') {
            "" => d.as_str(),
            trimmed => trimmed,
        };
        for pat in [d.to_string(), format!("{d}/**")] {
            if let Ok(p) = glob::Pattern::new(&pat) {
                set.push((i, p));
            }
        }
    }
    let set = Arc::new(set);
    cache.insert(patterns.to_vec(), set.clone());
    set
}

/// `[metrics]`: where the Prometheus metrics go (both off by default).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `host:port` serving `GET /metrics` (OpenMetrics text). Plain HTTP on a loopback
    /// address; any other address is served over HTTPS with the mutual TLS of `[api.tcp]`
    /// (its certificates and its `[[api.tcp.clients]]` allowlist, any role). Empty: off.
    pub listen: String,
    /// A node_exporter textfile collector file (e.g.
    /// `/var/lib/node_exporter/textfile_collector/inplaced.prom`), a node path written
    /// under `--root` like every node file, rewritten atomically when anything it reports
    /// changes (checked every 5 s: after every operation and drift scan). Its directory
    /// must exist and, with every directory above it, be owned by root and not group- or
    /// other-writable; otherwise it is not written and `status` lists the problem.
    /// Empty: off.
    pub textfile: String,
}

/// API access.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Group (name or gid, of the host) whose members may use the local socket as readers
    /// (coverage, status, operations, watch). Empty: the socket is root-only (0600); set:
    /// it is 0660 owned by root and that group. uid 0 is always admin.
    pub socket_group: String,
    /// The remote API.
    pub tcp: TcpConfig,
}

/// What the `files` section may write, and size limits (DESIGN §3.6).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Path prefixes files may be written under.
    pub allowed_prefixes: Vec<String>,
    /// Paths (globs; `*` within a component, `**` across) that are never written; they
    /// win over `allowed_prefixes`. A path under a listed directory is denied too.
    pub denied_paths: Vec<String>,
    /// Most files in one spec.
    pub max_files: usize,
    /// Largest file content, in bytes.
    pub max_file_bytes: u64,
    /// Largest spec (sum of file contents and settings), in bytes; also bounds gRPC
    /// messages.
    pub max_spec_bytes: u64,
    /// Most fields in one spec, counted on the raw gRPC message before it is decoded:
    /// every list entry, map entry and KubeletConfiguration value (see
    /// `inplace_wire::limits`).
    pub max_spec_elements: usize,
    /// Coverage calls (`GetCoverage`, and the planning of `Apply`) that run at once; more
    /// wait. Planning reads the node and is CPU-bound: more than the node's cores only
    /// adds memory.
    pub max_concurrent_coverage: usize,
    /// Agent memory the calls that carry a spec may reserve at once, MiB (default 384,
    /// the unit's `MemoryHigh`): before its message is decoded a call reserves what its
    /// fields and bytes will cost (`server::admit`) and waits while the agent is
    /// full. With the idle daemon, the messages being received and one running
    /// operation it keeps the agent under the unit's `MemoryMax=768M`.
    pub max_planning_mib: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            allowed_prefixes: ["/etc", "/var/lib/kubelet", "/usr/local", "/opt", "/srv"]
                .map(String::from)
                .to_vec(),
            denied_paths: [
                "/etc/shadow*",
                "/etc/gshadow*",
                "/etc/passwd*",
                "/etc/group*",
                "/etc/sudoers*",
                "/etc/sudoers.d",
                "/etc/inplaced",
                "/etc/pam.d",
                "/etc/security",
                "/etc/ssh/ssh_host_*",
            ]
            .map(String::from)
            .to_vec(),
            max_files: 1000,
            max_file_bytes: 16 << 20,
            max_spec_bytes: 64 << 20,
            max_spec_elements: 200_000,
            max_concurrent_coverage: 4,
            max_planning_mib: 384,
        }
    }
}

impl PolicyConfig {
    /// Why `path` may not be written, naming the rule; None when allowed.
    pub fn refuses(&self, path: &str) -> Option<String> {
        // each denied entry as itself and as `entry/**` (a path below a denied directory
        // is denied too), compiled once per distinct list; the first entry matching wins
        let set = denied_set(&self.denied_paths);
        if let Some(&(i, _)) = set.iter().find(|(_, p)| glob_matches(p, path)) {
            let d = &self.denied_paths[i];
            return Some(format!(
                "policy: {path} matches denied path {d:?} (policy.denied_paths)"
            ));
        }
        let allowed = self
            .allowed_prefixes
            .iter()
            .any(|a| path == a || path.starts_with(&format!("{}/", a.trim_end_matches('/'))));
        if !allowed {
            return Some(format!(
                "policy: {path} is not under an allowed prefix ({}; policy.allowed_prefixes)",
                self.allowed_prefixes.join(", ")
            ));
        }
        None
    }
}

/// How the agent reboots the node (`reboot_method`; a request's
/// `ApplyRequest.reboot_method` wins). What runs is in `apply::reboot_method`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RebootMethod {
    /// `systemctl reboot`: firmware, boot loader, its default entry (the default: some
    /// hardware does not come back from kexec: a NIC or GPU that needs its firmware's
    /// reset, a BMC watchdog that expects POST).
    #[default]
    Full,
    /// kexec of the installed kernel and initrd with the new command line (`kexec -s -l`,
    /// `systemctl kexec`): no firmware, no boot loader; the next cold boot uses the boot
    /// loader's default. A kexec that can not be loaded fails the reboot request.
    Kexec,
    /// kexec where the kernel permits it (`/proc/sys/kernel/kexec_load_disabled` 0,
    /// `/sys/kernel/security/lockdown` none, the kernel image and `kexec` present, the
    /// image loads), else a full reboot.
    Auto,
}

impl RebootMethod {
    /// The wire form.
    pub fn to_pb(self) -> inplace_wire::pb::RebootMethod {
        match self {
            RebootMethod::Full => inplace_wire::pb::RebootMethod::Full,
            RebootMethod::Kexec => inplace_wire::pb::RebootMethod::Kexec,
            RebootMethod::Auto => inplace_wire::pb::RebootMethod::Auto,
        }
    }
}

/// The whole agent config.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// How the agent reboots for an operation (top-level `reboot_method`).
    pub reboot_method: RebootMethod,
    /// Kubelet settings.
    pub kubelet: KubeletConfig,
    /// Sysctl settings.
    pub sysctl: SysctlConfig,
    /// Kernel-args settings.
    pub kernel_args: KernelArgsConfig,
    /// File disruption rules, first match wins.
    pub disruption: Vec<DisruptionRule>,
    /// Preservation facts.
    pub preservation: PreservationConfig,
    /// History retention.
    pub history: HistoryConfig,
    /// Drift detection.
    pub drift: DriftConfig,
    /// Prometheus metrics.
    pub metrics: MetricsConfig,
    /// Local API access.
    pub api: ApiConfig,
    /// Write policy and limits.
    pub policy: PolicyConfig,
    /// Kubernetes version upgrades: where the binaries come from.
    pub kubernetes: crate::kubernetes::KubernetesConfig,
}

impl Config {
    /// Parses TOML text; `origin` names the file in errors. Globs are checked here.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        for (i, e) in c.api.tcp.clients.iter().enumerate() {
            IdentityKind::check_entry(&format!("api.tcp.clients[{i}]"), &e.identity, e.kind)
                .map_err(|message| ConfigError::Parse {
                    path: origin.to_string(),
                    message,
                })?;
        }
        c.api
            .tcp
            .check_limits()
            .map_err(|message| ConfigError::Parse {
                path: origin.to_string(),
                message,
            })?;
        if !c.metrics.textfile.is_empty()
            && inplace_node::sysroot::components(&c.metrics.textfile).is_err()
        {
            return Err(ConfigError::Parse {
                path: origin.to_string(),
                message: format!(
                    "metrics.textfile {:?}: not an absolute, normalized node path (it is written under --root)",
                    c.metrics.textfile
                ),
            });
        }
        for (i, d) in c.policy.denied_paths.iter().enumerate() {
            compile_glob(d).map_err(|e| ConfigError::Parse {
                path: origin.to_string(),
                message: format!("policy.denied_paths[{i}]: {e}"),
            })?;
        }
        for (i, r) in c.disruption.iter().enumerate() {
            compile_glob(&r.path).map_err(|e| ConfigError::Parse {
                path: origin.to_string(),
                message: format!("disruption[{i}].path: {e}"),
            })?;
            if matches!(r.action, Action::Reload | Action::Restart) && r.units.is_empty() {
                return Err(ConfigError::Parse {
                    path: origin.to_string(),
                    message: format!(
                        "disruption[{i}].units: a {:?} rule needs the units to act on",
                        r.action
                    ),
                });
            }
        }
        c.kubernetes
            .validate()
            .map_err(|message| ConfigError::Parse {
                path: origin.to_string(),
                message,
            })?;
        Ok(c)
    }

    /// Loads `path`; a missing file gives the defaults when `required` is false. The file
    /// and every directory up to `/` must be owned by root (or the agent's uid) and not
    /// group- or other-writable, checked on the opened descriptors
    /// ([`inplace_node::trust::read_host`], sshd's `StrictModes`).
    ///
    /// # Errors
    /// [`ConfigError::Untrusted`] naming the path, owner and mode; [`ConfigError::Read`],
    /// [`ConfigError::Parse`].
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        use inplace_node::trust::{TrustError, read_host};
        let shown = path.display().to_string();
        let bytes = match read_host(path) {
            Ok(b) => b,
            Err(e) if e.is_missing() && !required => return Ok(Config::default()),
            Err(TrustError::Untrusted(u)) => return Err(ConfigError::Untrusted(u)),
            Err(TrustError::Missing { .. }) => {
                return Err(ConfigError::Read {
                    path: shown,
                    error: std::io::Error::from_raw_os_error(2),
                });
            }
            Err(TrustError::Io { error, .. }) => {
                return Err(ConfigError::Read { path: shown, error });
            }
            Err(e) => {
                return Err(ConfigError::Read {
                    path: shown,
                    error: std::io::Error::other(e.to_string()),
                });
            }
        };
        let text = String::from_utf8(bytes).map_err(|_| ConfigError::Parse {
            path: shown.clone(),
            message: "not UTF-8 text".into(),
        })?;
        Config::parse(&text, &shown)
    }

    /// The first disruption rule matching `path`.
    pub fn disruption_for(&self, path: &str) -> Option<&DisruptionRule> {
        self.disruption
            .iter()
            .find(|r| glob_matcher(&r.path).is_some_and(|m| glob_matches(&m, path)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_and_defaults() {
        let c = Config::parse(
            "[[disruption]]\npath = \"/etc/containerd/**\"\naction = \"restart\"\nunits = [\"containerd.service\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.kubelet.unit, "kubelet.service");
        let r = c.disruption_for("/etc/containerd/config.toml").unwrap();
        assert_eq!(r.units, vec!["containerd.service".to_string()]);
        assert!(c.disruption_for("/etc/other").is_none());
    }

    /// Every pattern the config took before (`globset` with `literal_separator`, the
    /// library this replaced) and still takes means what it meant: over generated
    /// patterns of literals, `/`, `*`, `?`, `**` components and character classes, and
    /// generated paths, a pattern compiles under both or is refused by
    /// [`compile_glob`] at parse, and matches the same paths when it compiles.
    #[test]
    fn globs_match_what_globset_matched() {
        use proptest::prelude::*;
        let piece = prop_oneof![
            Just("a"),
            Just("b"),
            Just("."),
            Just("/"),
            Just("*"),
            Just("?"),
            Just("/**/"),
            Just("**"),
            Just("[ab]"),
            Just("[!a]"),
            Just("[^a]"),
            Just("\\*"),
            Just("[a-c]"),
        ];
        // node paths are normalized (no empty component, no trailing /), and so are the
        // patterns compared
        let pattern = proptest::collection::vec(piece, 1..7)
            .prop_map(|v| format!("/{}", v.concat()))
            .prop_filter("normalized", |p| !p.contains("//") && !p.ends_with('/'));
        let component = prop_oneof![
            Just("a"),
            Just("b"),
            Just("ab"),
            Just(".b"),
            Just("a.c"),
            Just("*"),
            Just("^")
        ];
        let path =
            proptest::collection::vec(component, 1..5).prop_map(|v| format!("/{}", v.join("/")));
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 4000,
            ..Default::default()
        });
        runner
            .run(
                &(pattern, proptest::collection::vec(path, 8)),
                |(pattern, paths)| {
                    let old = globset::GlobBuilder::new(&pattern)
                        .literal_separator(true)
                        .build()
                        .map(|g| g.compile_matcher());
                    let new = compile_glob(&pattern);
                    if let (Ok(old), Ok(new)) = (&old, &new) {
                        for p in &paths {
                            prop_assert_eq!(
                                old.is_match(p),
                                glob_matches(new, p),
                                "pattern {:?}, path {:?}",
                                pattern,
                                p
                            );
                        }
                    }
                    prop_assert!(
                        new.is_err() || old.is_ok(),
                        "{pattern:?}: taken now, refused before"
                    );
                    Ok(())
                },
            )
            .unwrap();
    }

    /// The glob rules every user of `policy.denied_paths` and `disruption[].path` relies
    /// on: `*` and `?` stay within a component, `**` crosses them, a denied entry covers
    /// what is below it, the first matching entry is named; brace alternation and broken
    /// patterns are refused at parse, naming the key.
    #[test]
    fn globs_match_within_components_and_deny_what_is_below() {
        let p = PolicyConfig {
            denied_paths: [
                "/etc/a/*.conf",
                "/etc/b?",
                "/etc/[xy]z",
                "/etc/deep/**/key",
                "/etc/dir/",
            ]
            .map(String::from)
            .to_vec(),
            ..PolicyConfig::default()
        };
        let denied = |path: &str| p.refuses(path).is_some_and(|m| m.contains("denied path"));
        assert!(denied("/etc/a/x.conf"));
        assert!(denied("/etc/a/x.conf/below"));
        assert!(!denied("/etc/a/sub/x.conf"), "* must not cross /");
        assert!(denied("/etc/b1") && !denied("/etc/b12") && !denied("/etc/b/"));
        assert!(denied("/etc/xz") && denied("/etc/yz") && !denied("/etc/zz"));
        assert!(
            denied("/etc/deep/key") && denied("/etc/deep/1/2/key") && !denied("/etc/deep/1/keys")
        );
        assert!(denied("/etc/dir") && denied("/etc/dir/f") && !denied("/etc/dirt"));
        let m = p.refuses("/etc/yz/f").unwrap();
        assert!(m.contains("\"/etc/[xy]z\""), "{m}");

        for (key, toml, fault) in [
            (
                "policy.denied_paths[1]",
                "[policy]\ndenied_paths = [\"/etc/ok\", \"/etc/{a,b}\"]\n",
                "brace",
            ),
            (
                "policy.denied_paths[0]",
                "[policy]\ndenied_paths = [\"/etc/[ab\"]\n",
                "/etc/[ab",
            ),
            (
                "disruption[0].path",
                "[[disruption]]\npath = \"/etc/a**b\"\naction = \"none\"\n",
                "/etc/a**b",
            ),
            (
                "policy.denied_paths[0]",
                "[policy]\ndenied_paths = [\"/etc/[^a]\"]\n",
                "[!...]",
            ),
            (
                "disruption[0].path",
                "[[disruption]]\npath = '/etc/a\\*'\naction = \"none\"\n",
                "backslash",
            ),
        ] {
            let e = Config::parse(toml, "c.toml").unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(fault), "{e}");
        }
        let c = Config::parse(
            "[[disruption]]\npath = \"/etc/containerd/**\"\naction = \"none\"\n[[disruption]]\npath = \"/etc/*.d/*.conf\"\naction = \"none\"\n",
            "c.toml",
        )
        .unwrap();
        assert_eq!(
            c.disruption_for("/etc/containerd/a/b/c").unwrap().path,
            "/etc/containerd/**"
        );
        assert_eq!(
            c.disruption_for("/etc/x.d/y.conf").unwrap().path,
            "/etc/*.d/*.conf"
        );
        assert!(c.disruption_for("/etc/x.d/z/y.conf").is_none());
    }

    #[test]
    fn the_agents_own_directory_is_denied() {
        // node.d is written by the agent itself, never through the files section
        let why = PolicyConfig::default()
            .refuses("/etc/inplaced/node.d/10-x.yaml")
            .unwrap();
        assert!(why.contains("\"/etc/inplaced\""), "{why}");
    }

    #[test]
    fn reboot_method_is_full_unless_set() {
        assert_eq!(Config::default().reboot_method, RebootMethod::Full);
        for (text, m) in [
            ("full", RebootMethod::Full),
            ("kexec", RebootMethod::Kexec),
            ("auto", RebootMethod::Auto),
        ] {
            let c = Config::parse(&format!("reboot_method = \"{text}\"\n"), "t").unwrap();
            assert_eq!(c.reboot_method, m);
        }
        let e = Config::parse("reboot_method = \"warm\"\n", "/etc/inplaced/config.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("reboot_method") && e.contains("kexec"), "{e}");
    }

    #[test]
    fn unknown_key_is_an_error() {
        let e = Config::parse(
            "[kubelet]\nconfigpath = \"x\"\n",
            "/etc/inplaced/config.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("configpath"), "{e}");
    }
}

#[cfg(test)]
mod packaged {
    use super::*;

    #[test]
    fn packaged_default_config_equals_the_built_in_defaults() {
        let text = include_str!("../../../packaging/config.toml");
        assert_eq!(
            Config::parse(text, "packaging/config.toml").unwrap(),
            Config::default()
        );
        let demo = include_str!("../../../examples/config.toml");
        assert_eq!(
            Config::parse(demo, "examples/config.toml")
                .unwrap()
                .disruption
                .len(),
            2
        );
    }
}
