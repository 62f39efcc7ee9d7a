//! Node facts: bare metal or virtual machine, hardware identity, memory and disks, and the
//! preservation recommendation derived from them.
//!
//! Platform detection follows `systemd-detect-virt`'s DMI rules (`src/basic/virt.c`):
//! the SMBIOS `sys_vendor`, `product_name`, `board_vendor` and `bios_vendor` strings under
//! `/sys/class/dmi/id` are matched against known hypervisor vendors, then
//! `/sys/hypervisor/type` (Xen) and the `hypervisor` CPU flag in `/proc/cpuinfo` are
//! checked. Amazon EC2 `*.metal` instances are bare metal, as systemd treats them. All of it
//! is read from the sysroot, so a copy of a node gives the node's answer.

use crate::sysroot::Sysroot;
use inplace_wire::pb;

/// DMI vendor prefixes that identify a hypervisor, as in systemd's `dmi_vendor_table`.
const DMI_VM_VENDORS: &[(&str, &str)] = &[
    ("KVM", "kvm"),
    ("OpenStack", "kvm"),
    ("KubeVirt", "kvm"),
    ("Amazon EC2", "amazon"),
    ("QEMU", "qemu"),
    ("VMware", "vmware"),
    ("VMW", "vmware"),
    ("innotek GmbH", "oracle"),
    ("VirtualBox", "oracle"),
    ("Oracle Corporation", "oracle"),
    ("Xen", "xen"),
    ("Bochs", "bochs"),
    ("Parallels", "parallels"),
    ("BHYVE", "bhyve"),
    ("Hyper-V", "microsoft"),
    ("Apple Virtualization", "apple"),
    ("Google Compute Engine", "google"),
];

/// SMBIOS chassis type names (DMTF DSP0134 §7.4.1) for the evidence text.
fn chassis_name(t: u32) -> &'static str {
    match t {
        1 => "other",
        3 => "desktop",
        7 => "tower",
        9 => "laptop",
        17 => "main server chassis",
        23 => "rack mount chassis",
        24 => "sealed-case PC",
        25 => "multi-system chassis",
        28 => "blade",
        29 => "blade enclosure",
        _ => "unknown chassis",
    }
}

fn dmi(root: &Sysroot, name: &str) -> String {
    root.read_string(&format!("/sys/class/dmi/id/{name}"))
        .ok()
        .flatten()
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Reads the node facts from the sysroot. Memory and disks come from the live host through
/// sysinfo, and only when the sysroot is `/`. `kernel_args_backend` is filled by the caller.
pub fn detect(root: &Sysroot, declared_bindings: &[String]) -> pb::NodeFacts {
    let id = Dmi::read(root);
    let mut facts = pb::NodeFacts {
        vendor: id.vendor.clone(),
        product: id.product.clone(),
        chassis_type: id.chassis_type,
        declared_bindings: declared_bindings.to_vec(),
        ..Default::default()
    };
    let vm = hypervisor(root, &id, &mut facts.evidence);
    platform(&mut facts, vm, &id);
    facts.node_name = node_name(root);
    if let Ok(Some(osr)) = root.read_string_following("/etc/os-release") {
        facts.os = os_release_value(&osr, "PRETTY_NAME").unwrap_or_default();
    }
    if root.is_host_root() {
        live_host(&mut facts);
    }
    facts
}

/// The machine's DMI identity (`/sys/class/dmi/id`); empty strings and 0 when absent.
struct Dmi {
    vendor: String,
    product: String,
    board_vendor: String,
    bios_vendor: String,
    chassis_type: u32,
}

impl Dmi {
    fn read(root: &Sysroot) -> Dmi {
        Dmi {
            vendor: dmi(root, "sys_vendor"),
            product: dmi(root, "product_name"),
            board_vendor: dmi(root, "board_vendor"),
            bios_vendor: dmi(root, "bios_vendor"),
            chassis_type: dmi(root, "chassis_type").parse().unwrap_or(0),
        }
    }
}

/// The hypervisor the node runs under, with the evidence, or None on bare metal: by
/// DMI vendor (an EC2 `.metal` instance is bare metal, noted in `evidence`), then
/// `/sys/hypervisor/type`, then the CPU flag `hypervisor`.
fn hypervisor(root: &Sysroot, id: &Dmi, evidence: &mut Vec<String>) -> Option<(String, String)> {
    let product = &id.product;
    let mut vm: Option<(String, String)> = None;
    for (label, value) in [
        ("sys_vendor", &id.vendor),
        ("product_name", product),
        ("board_vendor", &id.board_vendor),
        ("bios_vendor", &id.bios_vendor),
    ] {
        if vm.is_some() || value.is_empty() {
            continue;
        }
        if let Some((_, hv)) = DMI_VM_VENDORS.iter().find(|(p, _)| value.starts_with(p)) {
            vm = Some((hv.to_string(), format!("DMI {label}: {value}")));
        }
        if value == "Microsoft Corporation" && product == "Virtual Machine" {
            vm = Some((
                "microsoft".into(),
                "DMI: Microsoft Corporation Virtual Machine".into(),
            ));
        }
    }
    if let Some((hv, _)) = &vm
        && hv == "amazon"
        && product.ends_with(".metal")
    {
        vm = None;
        evidence.push(format!(
            "DMI product_name: {product} (EC2 bare-metal instance)"
        ));
    }
    if vm.is_none()
        && let Ok(Some(t)) = root.read_string("/sys/hypervisor/type")
        && !t.trim().is_empty()
    {
        vm = Some((
            t.trim().to_string(),
            format!("/sys/hypervisor/type: {}", t.trim()),
        ));
    }
    if vm.is_none()
        && let Ok(Some(cpuinfo)) = root.read_string("/proc/cpuinfo")
        && cpuinfo
            .lines()
            .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"))
    {
        vm = Some((
            "unknown".into(),
            "/proc/cpuinfo: CPU flag 'hypervisor'".into(),
        ));
    }
    vm
}

/// Sets `platform` (`virtual-machine`, `bare-metal`, `unknown`), the hypervisor and the
/// evidence for them.
fn platform(facts: &mut pb::NodeFacts, vm: Option<(String, String)>, id: &Dmi) {
    let (vendor, product, chassis_type) = (&id.vendor, &id.product, id.chassis_type);
    match vm {
        Some((hv, ev)) => {
            facts.platform = "virtual-machine".into();
            facts.hypervisor = hv;
            facts.evidence.push(ev);
        }
        None if !vendor.is_empty() || !product.is_empty() => {
            facts.platform = "bare-metal".into();
            facts.evidence.push(format!("DMI sys_vendor: {vendor}"));
            facts.evidence.push(format!("DMI product_name: {product}"));
            if chassis_type != 0 {
                facts.evidence.push(format!(
                    "DMI chassis_type: {chassis_type} ({})",
                    chassis_name(chassis_type)
                ));
            }
        }
        None => {
            facts.platform = "unknown".into();
            facts
                .evidence
                .push("no DMI identity in /sys/class/dmi/id".into());
        }
    }
}

/// The environment files the kubelet's systemd unit reads its flags from, in the order
/// the kubeadm drop-in (`10-kubeadm.conf`) lists them, with their variable.
const KUBELET_FLAG_FILES: [(&str, &str); 3] = [
    ("/var/lib/kubelet/kubeadm-flags.env", "KUBELET_KUBEADM_ARGS"),
    ("/etc/default/kubelet", "KUBELET_EXTRA_ARGS"),
    ("/etc/sysconfig/kubelet", "KUBELET_EXTRA_ARGS"),
];

/// The Kubernetes node name the kubelet registers, as the kubelet computes it
/// (`pkg/kubelet` `nodeutil.GetHostname`): `--hostname-override` if given (the last one
/// on the command line wins, as pflag does; `$KUBELET_EXTRA_ARGS` comes after
/// `$KUBELET_KUBEADM_ARGS`), else the host name, trimmed and lower-cased. The host name
/// is `/etc/hostname` of the sysroot (the live `uname` name on `/` when that file is
/// missing). "" when none is known.
pub fn node_name(root: &Sysroot) -> String {
    let mut name = None;
    for (path, var) in KUBELET_FLAG_FILES {
        let Ok(Some(text)) = root.read_string(path) else {
            continue;
        };
        if let Ok(Some(flags)) = inplace_formats::kubelet::flags::parse(&text, var) {
            for f in flags.iter().filter(|f| f.name == "hostname-override") {
                name = f.value.clone();
            }
        }
    }
    let name = name.filter(|n| !n.trim().is_empty()).or_else(|| {
        root.read_string("/etc/hostname")
            .ok()
            .flatten()
            .and_then(|t| t.lines().next().map(str::to_string))
            .filter(|n| !n.trim().is_empty())
            .or_else(|| {
                root.is_host_root().then(|| {
                    rustix::system::uname()
                        .nodename()
                        .to_string_lossy()
                        .into_owned()
                })
            })
    });
    name.map(|n| n.trim().to_lowercase()).unwrap_or_default()
}

fn live_host(facts: &mut pb::NodeFacts) {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    facts.memory_bytes = sys.total_memory();
    let disks = sysinfo::Disks::new_with_refreshed_list();
    let mut out: Vec<pb::Disk> = disks
        .list()
        .iter()
        .map(|d| pb::Disk {
            name: d.name().to_string_lossy().into_owned(),
            mount_point: d.mount_point().display().to_string(),
            total_bytes: d.total_space(),
            removable: d.is_removable(),
            file_system: d.file_system().to_string_lossy().into_owned(),
        })
        .collect();
    out.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    facts.disks = out;
}

/// Value of `key` in os-release(5) text, unquoted.
pub fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches(['"', '\'']).to_string())
    })
}

/// The preservation recommendation the extension maps to `preserveOnInsufficientCoverage`:
/// preserve bare metal, and any machine whose config declares hardware bindings.
pub fn preservation(facts: &pb::NodeFacts, hardware_bound: bool) -> pb::Preservation {
    let mut reasons = Vec::new();
    if facts.platform == "bare-metal" {
        let what = [facts.vendor.as_str(), facts.product.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        reasons.push(format!("bare metal: {what}"));
    }
    if hardware_bound {
        reasons.push("declared hardware-bound in the agent config".to_string());
    }
    for b in &facts.declared_bindings {
        reasons.push(format!("declared binding: {b}"));
    }
    pb::Preservation {
        preserve: !reasons.is_empty(),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysroot whose `/sys/class/dmi/id` holds `dmi` (name, value) and, when given,
    /// `/proc/cpuinfo`.
    fn node(dmi: &[(&str, &str)], cpuinfo: Option<&str>) -> (tempfile::TempDir, Sysroot) {
        let d = tempfile::tempdir().unwrap();
        let id = d.path().join("sys/class/dmi/id");
        std::fs::create_dir_all(&id).unwrap();
        for (k, v) in dmi {
            std::fs::write(id.join(k), format!("{v}\n")).unwrap();
        }
        if let Some(c) = cpuinfo {
            std::fs::create_dir_all(d.path().join("proc")).unwrap();
            std::fs::write(d.path().join("proc/cpuinfo"), c).unwrap();
        }
        let s = Sysroot::open(d.path()).unwrap();
        (d, s)
    }

    #[test]
    fn a_dmi_vendor_names_the_hypervisor() {
        let (_d, s) = node(
            &[("sys_vendor", "QEMU"), ("product_name", "Standard PC")],
            None,
        );
        let f = detect(&s, &[]);
        assert_eq!(f.platform, "virtual-machine");
        assert_eq!(f.hypervisor, "qemu");
        assert_eq!(f.evidence, vec!["DMI sys_vendor: QEMU".to_string()]);
    }

    #[test]
    fn an_ec2_metal_instance_is_bare_metal() {
        let (_d, s) = node(
            &[
                ("sys_vendor", "Amazon EC2"),
                ("product_name", "m5.metal"),
                ("chassis_type", "1"),
            ],
            None,
        );
        let f = detect(&s, &[]);
        assert_eq!(f.platform, "bare-metal");
        assert_eq!(f.hypervisor, "");
        assert_eq!(f.chassis_type, 1);
        assert_eq!(
            f.evidence[0],
            "DMI product_name: m5.metal (EC2 bare-metal instance)"
        );
        assert_eq!(f.evidence[1], "DMI sys_vendor: Amazon EC2");
    }

    #[test]
    fn the_cpu_flag_or_nothing_decides_without_a_vendor() {
        let (_d, s) = node(&[], Some("processor: 0\nflags\t\t: fpu hypervisor sse\n"));
        let f = detect(&s, &["a".into()]);
        assert_eq!(
            (f.platform.as_str(), f.hypervisor.as_str()),
            ("virtual-machine", "unknown")
        );
        assert_eq!(f.declared_bindings, vec!["a".to_string()]);
        let (_d, s) = node(&[], None);
        let f = detect(&s, &[]);
        assert_eq!(f.platform, "unknown");
        assert_eq!(
            f.evidence,
            vec!["no DMI identity in /sys/class/dmi/id".to_string()]
        );
    }
}
