//! `/etc/kernel/cmdline` starting with a UTF-8 byte-order mark (EF BB BF), black box:
//! kernel-install copies the file's text into the boot entry's options as is (systemd's
//! kernel-install reads it with no BOM handling; 90-loaderentry.install's `read` keeps
//! the bytes too), so the kernel would get the BOM glued to its first argument
//! (`\xEF\xBB\xBFroot=...`, an unknown parameter: the root file system is not found).
//! The kernelArgs section refuses such a file naming it, the BOM and the fix, on every
//! backend that keeps it in agreement (BLS entries read by GRUB, systemd-boot), writes
//! nothing, and applies once the BOM is removed.

mod common;
use common::*;
use inplace_wire::pb::Phase;

const BOM: &[u8] = b"\xEF\xBB\xBF";

fn reason() -> String {
    "/etc/kernel/cmdline starts with a UTF-8 byte-order mark (bytes EF BB BF): kernel-install copies its text into new boot entries as is, so the kernel would read the mark as part of its first argument; remove the 3 bytes (sed -i '1s/^\\xEF\\xBB\\xBF//' /etc/kernel/cmdline), then apply again".to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_cmdline_with_a_bom_is_refused_naming_it_and_the_fix() {
    for fixture in ["fedora-41-bls", "systemd-boot"] {
        let mut node = Node::new(fixture);
        std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
        let plain = std::fs::read(node.path("/etc/kernel/cmdline")).unwrap();
        let with_bom = [BOM, plain.as_slice()].concat();
        std::fs::write(node.path("/etc/kernel/cmdline"), &with_bom).unwrap();
        node.start();
        let yaml = "kernelArgs: [nosmt]\n";
        let r = coverage(&node, yaml).await;
        let c = change(&r, "kernelArgs[nosmt]");
        assert!(!c.covered, "{fixture}: {}", c.reason);
        assert!(
            c.reason.contains(&reason()),
            "{fixture}: {}\nwanted: {}",
            c.reason,
            reason()
        );
        let before = snapshot(&node.root);
        let (_, msg) = refusal(&node, yaml).await;
        assert!(msg.contains(&reason()), "{fixture}: {msg}");
        assert_eq!(snapshot(&node.root), before, "{fixture}: nothing written");
        assert_eq!(
            std::fs::read(node.path("/etc/kernel/cmdline")).unwrap(),
            with_bom,
            "{fixture}"
        );
        // the fix: the BOM removed, the change applies to the file as to any other
        std::fs::write(node.path("/etc/kernel/cmdline"), &plain).unwrap();
        let op = apply(&node, yaml, "nosmt").await;
        assert_eq!(
            op.phase,
            Phase::RebootRequired as i32,
            "{fixture}: {}",
            op.message
        );
        let mut want = plain.clone();
        while want.last() == Some(&b'\n') {
            want.pop();
        }
        want.extend_from_slice(b" nosmt\n");
        assert_eq!(
            String::from_utf8(std::fs::read(node.path("/etc/kernel/cmdline")).unwrap()).unwrap(),
            String::from_utf8(want).unwrap(),
            "{fixture}"
        );
    }
}
