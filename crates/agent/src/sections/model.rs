//! The aggregates the sections fill: the validated [`NodeSpec`], with the drivers that
//! convert it from the wire form and merge its drop-ins ([`NodeSpec::from_pb`]) and
//! hash it ([`NodeSpec::hash`]) by calling each section's
//! `spec.rs` in turn, and the [`Observed`] node, one field per section.
//!
//! The generic rules (the canonical JSON the hash is taken over, the drop-in file form)
//! are in [`crate::spec`].

use std::collections::BTreeMap;

use crate::sections::kernel_args::observe::KernelArgsObs;
use crate::sections::kit::file_items::FileSpec;
use crate::sections::kit::observe::{FileObs, Unknown};
use crate::sections::kubelet::observe::KubeletObs;
use crate::sections::kubernetes::observe::KubernetesObs;
use crate::sections::ntp::observe::NtpObs;
use crate::sections::sysctls::observe::SysctlObs;
use crate::sections::{dropins, files, kernel_args, kubelet, kubernetes, ntp, sysctls};
use inplace_node::accounts::Accounts;
use inplace_wire::names::SpecError;
use inplace_wire::pb;
use inplace_wire::yaml;

/// A validated NodeSpec: one field per section, each validated,
/// merged and hashed by its section's `spec.rs`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSpec {
    /// Files, in spec order (paths unique; [`files::spec`]).
    pub files: Vec<FileSpec>,
    /// Partial KubeletConfiguration and kubelet flags ([`kubelet::spec`]).
    pub kubelet: kubelet::spec::KubeletSpec,
    /// Managed kernel arguments, in order ([`kernel_args::spec`]).
    pub kernel_args: Vec<String>,
    /// Sysctls, dotted key → value ([`sysctls::spec`]).
    pub sysctls: BTreeMap<String, String>,
    /// Time sources for the node's time daemon; None = not managed.
    pub ntp: Option<ntp::spec::NtpSpec>,
    /// The node's Kubernetes version; None = not managed.
    pub kubernetes: Option<kubernetes::spec::KubernetesSpec>,
    /// The node.d drop-ins, sorted by name. Their items are already merged into the
    /// fields above; each is also kept as `/etc/inplaced/node.d/<name>`.
    pub dropins: Vec<dropins::spec::DropInSpec>,
}

/// Parses and validates one drop-in document (a NodeSpec in the YAML file form) on its
/// own, before merging ([`crate::spec::parse_dropin_with`]): errors name the field
/// prefixed with `dropins[<name>].`.
pub fn parse_dropin(name: &str, content: &str) -> Result<NodeSpec, SpecError> {
    crate::spec::parse_dropin_with(name, content, NodeSpec::from_pb_items)
}

/// Where each item of a merged spec comes from, for errors naming both sources: one
/// field per section that refuses an item set twice.
#[derive(Default)]
struct Sources {
    files: files::spec::Sources,
    kubelet: kubelet::spec::Sources,
    sysctls: sysctls::spec::Sources,
    ntp: ntp::spec::Sources,
    kubernetes: kubernetes::spec::Sources,
}

impl Sources {
    /// Records the items of `part`, found under `prefix` (`""` for the spec itself,
    /// `dropins[x].` for a drop-in), and merges them into `spec`; an item that is set
    /// differently by an earlier source is an error naming both.
    fn merge(
        &mut self,
        spec: &mut NodeSpec,
        part: NodeSpec,
        prefix: &str,
    ) -> Result<(), SpecError> {
        files::spec::merge(&mut self.files, &mut spec.files, part.files, prefix)?;
        kubelet::spec::merge(&mut self.kubelet, &mut spec.kubelet, part.kubelet, prefix)?;
        kernel_args::spec::merge(&mut spec.kernel_args, part.kernel_args, prefix);
        sysctls::spec::merge(&mut self.sysctls, &mut spec.sysctls, part.sysctls, prefix)?;
        ntp::spec::merge(&mut self.ntp, &mut spec.ntp, part.ntp, prefix)?;
        kubernetes::spec::merge(
            &mut self.kubernetes,
            &mut spec.kubernetes,
            part.kubernetes,
            prefix,
        )?;
        Ok(())
    }
}

impl NodeSpec {
    /// Validates a wire spec and merges its drop-ins into it. Errors name the first
    /// offending field: `files[2].path`, `ntp.servers[0]`, `dropins[1].name`, or inside a
    /// drop-in `dropins[<name>].<field>`. An item set by two sources (the spec and a
    /// drop-in, or two drop-ins) with different values is an error naming both; the same
    /// value twice is accepted, kernel arguments are added once. A `files` item at a path
    /// the `ntp` section writes ([`inplace_formats::ntp::PATHS`]) is an error naming both.
    pub fn from_pb(p: &pb::NodeSpec) -> Result<NodeSpec, SpecError> {
        let own = NodeSpec::from_pb_items(p)?;
        let dropins = dropins::spec::from_pb(&p.dropins)?;
        let mut spec = NodeSpec::default();
        let mut sources = Sources::default();
        sources.merge(&mut spec, own, "")?;
        for d in dropins {
            let part = parse_dropin(&d.name, &d.content)?;
            sources.merge(&mut spec, part, &format!("dropins[{}].", d.name))?;
            spec.dropins.push(d);
        }
        ntp::spec::check_files(&sources.ntp, |p| sources.files.source_of(p))?;
        Ok(spec)
    }

    /// Validates the items of one document (no drop-ins), section by section in the
    /// order of the fields: the first error is the first section's.
    pub(crate) fn from_pb_items(p: &pb::NodeSpec) -> Result<NodeSpec, SpecError> {
        Ok(NodeSpec {
            files: files::spec::from_pb(&p.files)?,
            kubelet: kubelet::spec::from_pb(p.kubelet.as_ref())?,
            kernel_args: kernel_args::spec::from_pb(&p.kernel_args)?,
            sysctls: sysctls::spec::from_pb(&p.sysctls)?,
            ntp: ntp::spec::from_pb(p.ntp.as_ref())?,
            kubernetes: kubernetes::spec::from_pb(p.kubernetes.as_ref())?,
            dropins: Vec::new(),
        })
    }

    /// The id of every item the spec sets, as its changes are named
    /// ([`inplace_wire::ids::ChangeId`]): `files[<path>]`, `kubelet.flags[<name>]`,
    /// `kubelet.config.<leaf>` (each leaf: a value that is not an object),
    /// `kernelArgs[<key>]`, `sysctls[<key>]`, `ntp`, `kubernetes.version`. For comparing
    /// two specs item by item (a quarantined record's claims,
    /// [`crate::state::StateDir::check_record_claims`]).
    pub fn item_ids(&self) -> std::collections::BTreeSet<String> {
        use inplace_wire::ids::ChangeId;
        fn leaves(v: &serde_json::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            match v {
                serde_json::Value::Object(m) if !m.is_empty() => {
                    for (k, v) in m {
                        path.push(k.clone());
                        leaves(v, path, out);
                        path.pop();
                    }
                }
                _ => out.push(path.clone()),
            }
        }
        let mut config = Vec::new();
        if let Some(c) = &self.kubelet.config {
            leaves(
                &serde_json::Value::Object(c.clone()),
                &mut Vec::new(),
                &mut config,
            );
        }
        let arg_key = |a: &String| {
            inplace_formats::cmdline::Arg::parse_one(a)
                .map(|a| a.key().to_string())
                .unwrap_or_else(|_| a.clone())
        };
        let ids = self.files.iter().map(|f| ChangeId::File(f.path.clone()));
        let ids = ids.chain(
            self.kubelet
                .flags
                .keys()
                .cloned()
                .map(ChangeId::KubeletFlag),
        );
        let ids = ids.chain(config.into_iter().map(ChangeId::KubeletConfig));
        let ids = ids.chain(
            self.kernel_args
                .iter()
                .map(arg_key)
                .map(ChangeId::KernelArg),
        );
        let ids = ids.chain(self.sysctls.keys().cloned().map(ChangeId::Sysctl));
        let ids = ids.chain(self.ntp.is_some().then_some(ChangeId::Ntp));
        let ids = ids.chain(
            self.kubernetes
                .is_some()
                .then_some(ChangeId::KubernetesVersion),
        );
        ids.map(|i| i.to_string()).collect()
    }

    /// `sha256:<hex>` over a canonical JSON encoding ([`crate::spec::hash_of`]: object
    /// keys sorted, file content hashed), so equal specs hash equally whatever their YAML
    /// or map order. Each section adds its part; the parts of the sections added later
    /// (`ntp`, `kubernetes`, `dropins`) only when set, so the hash of a spec without them
    /// is what it always was (an applied record names its spec by this hash).
    pub fn hash(&self) -> String {
        let mut v = serde_json::Map::new();
        files::spec::hash(&self.files, &mut v);
        kubelet::spec::hash(&self.kubelet, &mut v);
        kernel_args::spec::hash(&self.kernel_args, &mut v);
        sysctls::spec::hash(&self.sysctls, &mut v);
        ntp::spec::hash(self.ntp.as_ref(), &mut v);
        kubernetes::spec::hash(self.kubernetes.as_ref(), &mut v);
        dropins::spec::hash(&self.dropins, &mut v);
        crate::spec::hash_of(serde_json::Value::Object(v))
    }
}

/// Parses and validates in one step.
pub fn parse_validated(text: &str) -> Result<(pb::NodeSpec, NodeSpec), SpecError> {
    let p = yaml::parse(text)?;
    let s = NodeSpec::from_pb(&p)?;
    Ok((p, s))
}

/// Everything observed.
#[derive(Debug)]
pub struct Observed {
    /// Users and groups of the node.
    pub accounts: Accounts,
    /// Files of the spec and of the record, by path.
    pub files: BTreeMap<String, FileObs>,
    /// Saved originals of record files that leave the spec: backup name → bytes.
    pub originals: BTreeMap<String, Vec<u8>>,
    /// Kubelet files.
    pub kubelet: KubeletObs,
    /// The kernel-args backend, the running command line and the boot id.
    pub kernel_args: KernelArgsObs,
    /// Sysctls.
    pub sysctls: SysctlObs,
    /// The time daemon when the spec manages `ntp`: the daemon found, or what was looked
    /// for ([`inplace_formats::ntp::detect`]); its file is in `files`.
    pub ntp: NtpObs,
    /// The node's Kubernetes binaries and kubeadm files when the spec names a version.
    pub kubernetes: Option<KubernetesObs>,
    /// Every observation a section could not make ([`Unknown`]), for `status`.
    pub unknown: Vec<Unknown>,
}

impl Observed {
    /// The file at `path` as observed (absent when it was not observed).
    pub fn file(&self, path: &str) -> FileObs {
        self.files.get(path).cloned().unwrap_or(FileObs::Absent)
    }

    /// Nothing observed yet: each section fills in what it reads.
    pub fn empty() -> Self {
        Observed {
            accounts: Accounts::default(),
            files: BTreeMap::new(),
            originals: BTreeMap::new(),
            kubelet: KubeletObs::default(),
            kernel_args: KernelArgsObs::empty(),
            sysctls: SysctlObs::default(),
            ntp: None,
            kubernetes: None,
            unknown: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sections::kit::tests::spec as with_dropins;

    #[test]
    fn hashes_of_existing_specs_are_pinned() {
        let everything = "files:\n- path: /etc/x\n  content: aGVsbG8=\n  mode: \"0600\"\n  owner: etcd:etcd\n- path: /etc/y\n  owner: \"997\"\n  group: \"0\"\nkubelet:\n  config:\n    maxPods: 250\n    systemReserved: {cpu: 500m, memory: 1Gi}\n    evictionHard: {memory.available: 100Mi}\n  flags: {max-pods: \"250\", node-labels: a=b}\nkernelArgs: [isolcpus=2-3, hugepages=16, isolcpus=2-3]\nsysctls: {vm.swappiness: \"10\", net/ipv4/ip_forward: \"1\"}\nntp:\n  servers: [ntp1.example.com, 10.0.0.1]\nkubernetes: {version: v1.35.2}\n";
        // main spec, drop-ins, hash
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case] = &[
            (
                "",
                &[],
                "sha256:05f2b753f9e3e4e9c0c0f3ac9ca93fa2d3131bc0136f755d316d5352f61c1858",
            ),
            (
                "sysctls: {vm.swappiness: \"10\"}\n",
                &[],
                "sha256:cfb366f6aa5a07c87d624e99d6fd819deb5d8a3d3ae257b01dfd1e6d1db70743",
            ),
            (
                everything,
                &[],
                "sha256:8fa3bbee512615be0a12465bcb871212b5b0554fac888cb61b18fc0c73c842cf",
            ),
            (
                "kernelArgs: [a=1]\n",
                &[
                    (
                        "20-b.yaml",
                        "kernelArgs: [a=1, b=2]\nkubelet:\n  flags: {v: \"2\"}\n",
                    ),
                    (
                        "10-a.yaml",
                        "files:\n- path: /etc/z\nntp:\n  servers: [n1]\n",
                    ),
                ],
                "sha256:38180a2642ff4d0c02efaaa213c83d4ebfed9b4e8a6d10144090bbc739065d22",
            ),
        ];
        for (i, (main, dropins, want)) in cases.iter().enumerate() {
            let got = with_dropins(main, dropins).unwrap().hash();
            assert_eq!(&got, want, "case {i}");
        }
    }

    #[test]
    fn dropins_merge_into_the_spec() {
        let s = with_dropins(
            "sysctls: {vm.swappiness: \"10\"}\nkernelArgs: [a=1]\nkubelet:\n  config:\n    systemReserved: {cpu: 500m}\n",
            &[
                (
                    "20-b.yaml",
                    "kernelArgs: [a=1, b=2]\nkubelet:\n  config:\n    systemReserved: {memory: 1Gi}\n  flags: {max-pods: \"250\"}\n",
                ),
                (
                    "10-a.yaml",
                    "sysctls: {vm.swappiness: \"10\", vm.max_map_count: \"262144\"}\nfiles:\n- path: /etc/x\nntp:\n  servers: [n1]\n",
                ),
            ],
        )
        .unwrap();
        assert_eq!(s.kernel_args, vec!["a=1", "b=2"]);
        assert_eq!(s.sysctls.len(), 2);
        assert_eq!(s.files[0].path, "/etc/x");
        assert_eq!(s.kubelet.flags["max-pods"], "250");
        assert_eq!(
            serde_json::Value::Object(s.kubelet.config.clone().unwrap()),
            serde_json::json!({"systemReserved": {"cpu": "500m", "memory": "1Gi"}})
        );
        assert_eq!(s.ntp.as_ref().unwrap().servers, vec!["n1"]);
        // sorted by name
        let names: Vec<&str> = s.dropins.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec!["10-a.yaml", "20-b.yaml"]);
        assert_eq!(s.dropins[0].path(), "/etc/inplaced/node.d/10-a.yaml");
    }

    #[test]
    fn a_dropin_is_checked_as_a_document_of_its_own() {
        // main spec, drop-ins, field of the error, what its message says
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (
                "",
                &[("a.yaml", "dropins:\n- name: b.yaml\n")],
                "dropins[a.yaml].dropins",
                "can not hold drop-ins",
            ),
            (
                "",
                &[("a.yaml", "filez: []\n")],
                "dropins[a.yaml].spec",
                "filez",
            ),
            (
                "",
                &[("a.yaml", "ntp:\n  servers: [\"a b\"]\n")],
                "dropins[a.yaml].ntp.servers[0]",
                "whitespace",
            ),
            // the spec's own items are checked before the drop-ins' names
            (
                "sysctls: {vm.x: \"\"}\n",
                &[("a b.yaml", "")],
                "sysctls[vm.x]",
                "non-empty",
            ),
        ];
        for (main, dropins, field, says) in cases {
            let e = with_dropins(main, dropins).unwrap_err();
            assert_eq!(&e.field, field, "{e}");
            assert!(e.message.contains(says), "{e}");
        }
    }

    #[test]
    fn sections_are_validated_in_the_order_of_the_fields() {
        // a document wrong in every section: the first section's error is the one
        let e = with_dropins(
            "kubernetes: {version: x}\nntp:\n  servers: [\"\"]\nsysctls: {vm.x: \"\"}\nkernelArgs: [root=/dev/sda]\nkubelet:\n  config:\n    kind: X\nfiles:\n- path: x\n",
            &[],
        )
        .unwrap_err();
        assert_eq!(e.field, "files[0].path");
        let e = with_dropins(
            "kubernetes: {version: x}\nntp:\n  servers: [\"\"]\nsysctls: {vm.x: \"\"}\nkernelArgs: [root=/dev/sda]\n",
            &[],
        )
        .unwrap_err();
        assert_eq!(e.field, "kernelArgs[0]");
    }
}
