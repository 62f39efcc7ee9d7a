//! Faithful edits and exact reverts for the shell-style and boot-loader
//! formats, one property per format over generated layouts its consumer accepts:
//! (a) the bytes the change does not touch are identical, (b) the consumer reads back the
//! intended value (`bash` sourcing the fragment as grub-mkconfig does; systemd's
//! `EnvironmentFile=` parser, and bash where the two agree; the Boot Loader
//! Specification's concatenation of `options` lines; GRUB's `load_env`), (c) apply then
//! revert gives back the original bytes.

use std::process::Command;

use inplace_formats::cmdline;
use inplace_formats::cmdline::{Arg, Cmdline, PlainText};
use inplace_formats::kubelet::flags;
use inplace_formats::textedit::{Quoting, shell_encode, systemd_encode};
use inplace_formats::{bls, grub_default, grubenv};
use proptest::prelude::*;

/// The arguments the spec adds.
fn added() -> Vec<Arg> {
    ["isolcpus=2-7", "nohz_full=2-7", "rcu_nocbs=2-7"]
        .map(|s| Arg::parse_one(s).unwrap())
        .to_vec()
}

/// (a): `out` is `orig` with one run of bytes inserted, nothing else changed.
fn only_insertion(orig: &[u8], out: &[u8]) -> bool {
    let p = orig.iter().zip(out).take_while(|(a, b)| a == b).count();
    out.len() >= orig.len() && out.ends_with(&orig[p..])
}

/// Sources `text` with bash, as grub-mkconfig sources /etc/default/grub, and prints `var`.
fn bash_value(text: &str, var: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("grub");
    std::fs::write(&f, text).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". \"$1\" 2>/dev/null; printf %s \"${var}\""))
        .arg("bash")
        .arg(&f)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// A kernel argument as decoded (the shell and env-file layers add their own quoting).
fn arb_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{1,6}",
        "[a-z_]{1,5}=[a-z0-9,.:/-]{1,8}",
        Just("dyndbg=\"file x.c +p\"".to_string()),
        Just("x=$HOME".to_string()),
        Just("it's=1".to_string()),
        Just("a\\b=1".to_string()),
        Just("--".to_string()),
    ]
}

/// One quoted segment of a shell value: its quoting, the raw separator before its
/// argument (what that quoting allows: spaces, tabs, a `\` continuation inside double
/// quotes, a newline inside single quotes, escaped blanks unquoted) and the argument.
fn arb_segment() -> impl Strategy<Value = (Quoting, String, String)> {
    let q = prop_oneof![
        Just(Quoting::Double),
        Just(Quoting::Single),
        Just(Quoting::Plain)
    ];
    (q, 0..4usize, arb_arg()).prop_map(|(q, s, arg)| {
        let sep = match q {
            Quoting::Double => [" ", "  ", "\t", " \\\n  "][s],
            Quoting::Single => [" ", "\t", "\n ", "   "][s],
            Quoting::Plain => ["\\ ", "\\\t", "\\ \\ ", "\\ "][s],
        };
        (q, sep.to_string(), arg)
    })
}

/// The raw shell text of a value made of `segs` (the first one has no separator).
fn shell_value(segs: &[(Quoting, String, String)]) -> String {
    let mut out = String::new();
    for (i, (q, sep, arg)) in segs.iter().enumerate() {
        let sep = if i == 0 { "" } else { sep.as_str() };
        let body = format!("{sep}{}", shell_encode(*q, arg));
        match q {
            Quoting::Double => out.push_str(&format!("\"{body}\"")),
            Quoting::Single => out.push_str(&format!("'{body}'")),
            Quoting::Plain => out.push_str(&body),
        }
    }
    if out.is_empty() {
        out.push_str("\"\"");
    }
    out
}

/// A whole `/etc/default/grub`-like fragment: optional BOM (before a comment, where sh
/// ignores it), CRLF or LF, `$VAR` and `$(...)` in other assignments, a trailing comment.
fn arb_grub() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(arb_segment(), 0..5),
        prop_oneof![Just(""), Just("  "), Just(" # keep me"), Just("\t#x")],
        any::<bool>(),
    )
        .prop_map(|(bom, crlf, segs, tail, export)| {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut t = String::new();
            if bom {
                t.push('\u{feff}');
            }
            t.push_str(&format!("# If you change this file, run update-grub{nl}"));
            t.push_str(&format!("GRUB_DEFAULT=0{nl}"));
            t.push_str(&format!(
                "GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${{NAME:-Debian}} ) 2>/dev/null || echo Debian`{nl}"
            ));
            t.push_str(&format!("GRUB_CMDLINE_LINUX_DEFAULT=\"quiet splash\"{nl}"));
            let export = if export { "export " } else { "" };
            // with CRLF, blanks before the `\r` would make it a command word (sh then
            // runs the assignment as a prefix of it, which is refused for that reason)
            let tail = if crlf && tail.trim().is_empty() { "" } else { tail };
            t.push_str(&format!(
                "{export}GRUB_CMDLINE_LINUX={}{tail}{nl}",
                shell_value(&segs)
            ));
            t.push_str(&format!("GRUB_TERMINAL=\"$GRUB_TERMINAL console\"{nl}"));
            t
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn grub_default_edits_in_place(text in arb_grub(), n in 1..=3usize) {
        const V: &str = "GRUB_CMDLINE_LINUX";
        let add = &added()[..n];
        let before = bash_value(&text, V);
        prop_assert_eq!(
            grub_default::read_var(&text, V).unwrap().unwrap_or_default(),
            before.clone(),
            "our reading is bash's"
        );
        let out = grub_default::edit_cmdline_var(&text, V, &[], add).unwrap();
        // (a) one insertion, every other byte kept
        prop_assert!(only_insertion(text.as_bytes(), out.as_bytes()), "{:?}\n->\n{:?}", text, out);
        // (b) bash reads the intended command line
        let want = Cmdline::parse(&before).apply(&[], add);
        prop_assert_eq!(Cmdline::parse(&bash_value(&out, V)), want);
        // (c) dropping the arguments again restores the bytes
        let back = grub_default::edit_cmdline_var(&out, V, add, &[]).unwrap();
        prop_assert_eq!(back, text);
    }

    #[test]
    fn plain_cmdline_edits_in_place(
        args in prop::collection::vec(arb_arg(), 0..6),
        seps in prop::collection::vec("[ \t\n]{1,3}", 7),
        n in 1..=3usize,
    ) {
        let mut text = seps[6].clone();
        for (a, s) in args.iter().zip(&seps) {
            text.push_str(a);
            text.push_str(s);
        }
        let add = &added()[..n];
        let mut t = PlainText(text.clone());
        let Ok(()) = cmdline::edit_in_place(&mut t, &[], add);
        prop_assert!(only_insertion(text.as_bytes(), t.0.as_bytes()));
        prop_assert_eq!(Cmdline::parse(&t.0), Cmdline::parse(&text).apply(&[], add));
        let Ok(()) = cmdline::edit_in_place(&mut t, add, &[]);
        prop_assert_eq!(t.0, text);
    }
}

/// A kubelet flag as decoded.
fn arb_flag() -> impl Strategy<Value = String> {
    prop_oneof![
        "--[a-z]{1,6}(-[a-z]{1,4})?=[a-z0-9./:<%,]{1,10}",
        "--[a-z]{1,8}",
        Just("--node-labels=a=b,c=\"d\"".to_string()),
        Just("--root-dir=$HOME".to_string()),
        Just("--x=it's".to_string()),
        Just("--y=a\\b".to_string()),
        Just("--max-pods=110".to_string()),
    ]
}

/// One segment of an env-file value, as [`arb_segment`] for systemd's parser: a quote
/// opens only where a value (or a segment after a closing quote) starts, a `\`
/// continuation joins lines outside single quotes.
fn arb_env_segment() -> impl Strategy<Value = (Quoting, String, String)> {
    let q = prop_oneof![
        Just(Quoting::Double),
        Just(Quoting::Single),
        Just(Quoting::Plain)
    ];
    (q, 0..4usize, arb_flag()).prop_map(|(q, s, flag)| {
        let sep = match q {
            Quoting::Double => [" ", "  ", "\t", " \\\n"][s],
            Quoting::Single => [" ", "\t", "\n", "  "][s],
            Quoting::Plain => ["\\ ", "\\\t", " ", " \\\n"][s],
        };
        (q, sep.to_string(), flag)
    })
}

/// The env file, and whether bash reads the value as systemd does (no unquoted
/// whitespace, no quote after an unquoted character, no `$` outside single quotes).
fn arb_env() -> impl Strategy<Value = (String, bool)> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(arb_env_segment(), 0..5),
        prop_oneof![Just(""), Just("  "), Just(" \t")],
        any::<bool>(),
    )
        .prop_map(|(bom, crlf, segs, tail, semicolon)| {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut value = String::new();
            let mut bash_agrees = !crlf;
            let mut after_plain = false;
            for (i, (q, sep, flag)) in segs.iter().enumerate() {
                let sep = if i == 0 { "" } else { sep.as_str() };
                let body = format!("{sep}{}", systemd_encode(*q, flag));
                match q {
                    // systemd opens a quote only after a quote closed (or at the start)
                    Quoting::Double | Quoting::Single if after_plain => {
                        value.push_str(&systemd_encode(Quoting::Plain, &format!("{sep}{flag}")));
                        bash_agrees = false;
                    }
                    Quoting::Double => {
                        value.push_str(&format!("\"{body}\""));
                        bash_agrees &= !flag.contains('$');
                    }
                    Quoting::Single => value.push_str(&format!("'{}'", body)),
                    Quoting::Plain => {
                        value.push_str(&body);
                        after_plain = true;
                        bash_agrees = false;
                    }
                }
            }
            let mut t = String::new();
            if bom {
                t.push('\u{feff}');
                t.push_str(&format!("# kubeadm flags{nl}"));
            }
            if semicolon {
                // a systemd comment, a syntax error for bash
                t.push_str(&format!("; comment{nl}"));
                bash_agrees = false;
            }
            t.push_str(&format!("OTHER=\"$X y\"{nl}"));
            t.push_str(&format!("KUBELET_KUBEADM_ARGS={value}{tail}{nl}# end{nl}"));
            (t, bash_agrees)
        })
}

fn flag_words(text: &str) -> Vec<String> {
    flags::parse(text, "KUBELET_KUBEADM_ARGS")
        .unwrap()
        .unwrap_or_default()
        .into_iter()
        .map(|f| match f.value {
            Some(v) => format!("--{}={v}", f.name),
            None => format!("--{}", f.name),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn env_file_edits_in_place(
        (text, bash_agrees) in arb_env(),
        name in prop_oneof![Just("max-pods"), Just("zz-last"), Just("a-first")],
    ) {
        const V: &str = "KUBELET_KUBEADM_ARGS";
        let Ok(Some(before)) = flags::parse(&text, V) else {
            // not a flag list (a word without dashes): nothing to check here
            return Ok(());
        };
        let set = vec![(name.to_string(), "250".to_string())];
        let out = flags::edit(&text, V, &set, &[]).unwrap();
        let had = before.iter().any(|f| f.name == name);
        if !had {
            // (a) a new flag is one insertion
            prop_assert!(only_insertion(text.as_bytes(), out.as_bytes()), "{:?}\n->\n{:?}", text, out);
        }
        // (b) systemd's parser reads the intended flags
        let after = flag_words(&out);
        let want_word = format!("--{name}=250");
        prop_assert!(after.contains(&want_word));
        prop_assert_eq!(after.len(), before.len() + usize::from(!had)
            - before.iter().filter(|f| f.name == name).count().saturating_sub(1) * usize::from(had));
        if bash_agrees {
            let words: Vec<String> = bash_value(&out, V).split_whitespace().map(String::from).collect();
            prop_assert_eq!(words, after.clone());
        }
        // (c) dropping the new flag, or setting a changed one back to its prior value
        // (what the kubelet section's revert does), restores the bytes
        if !had {
            prop_assert_eq!(flags::edit(&out, V, &[], &[name.to_string()]).unwrap(), text);
        } else if before.iter().filter(|f| f.name == name).count() == 1 {
            let prior = before.iter().find(|f| f.name == name).unwrap().value.clone().unwrap();
            let back = flags::edit(&out, V, &[(name.to_string(), prior.clone())], &[]).unwrap();
            if prior.contains("--") {
                // systemd joined two quoted segments into this one word (`"--a=1" --b`
                // reads `--a=1--b`): the changed characters are rewritten in one quoting,
                // so only the value read back is the original
                prop_assert_eq!(flags::parse(&back, V).unwrap(), flags::parse(&text, V).unwrap());
            } else {
                prop_assert_eq!(back, text);
            }
        }
    }
}

/// A BLS entry whose options are spread over several `options` lines (joined by the
/// loaders with one space), with padding, trailing blanks, CRLF and comments.
fn arb_bls() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop::collection::vec(
            (
                prop::collection::vec("[a-z_]{1,5}(=[a-z0-9,.]{1,6})?", 1..4),
                prop_oneof![Just(" "), Just("    "), Just("\t")],
                prop_oneof![Just(""), Just(" "), Just("\t ")],
            ),
            0..4,
        ),
        any::<bool>(),
    )
        .prop_map(|(crlf, lines, final_nl)| {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut t = format!("title Fedora Linux{nl}version 6.15.9{nl}linux /vmlinuz{nl}");
            for (args, pad, trail) in &lines {
                t.push_str(&format!("options{pad}{}{trail}{nl}", args.join("  ")));
                t.push_str(&format!("# options not-this{nl}"));
            }
            t.push_str("grub_class fedora");
            if final_nl {
                t.push_str(nl);
            }
            t
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn bls_edits_in_place(text in arb_bls(), n in 1..=3usize) {
        let add = &added()[..n];
        let e = bls::Entry::parse("m-6.15.9.conf", &text).unwrap();
        let before = e.options_cmdline();
        let out = e.edit_options(&[], add).unwrap();
        let has_options = e.options().is_some();
        if has_options {
            prop_assert!(only_insertion(text.as_bytes(), out.as_bytes()));
        }
        let e2 = bls::Entry::parse("m-6.15.9.conf", &out).unwrap();
        prop_assert_eq!(e2.options_cmdline(), before.apply(&[], add));
        let back = e2.edit_options(add, &[]).unwrap();
        prop_assert_eq!(back, text);
    }

    #[test]
    fn grubenv_edits_in_place(
        opts in prop::collection::vec("[a-z_]{1,5}(=[a-z0-9,./\\\\]{1,6})?", 0..6),
        trailing_space in any::<bool>(),
        warning in any::<bool>(),
        n in 1..=3usize,
    ) {
        let mut block = String::from("# GRUB Environment Block\n");
        if warning {
            block.push_str("# WARNING: Do not edit this file by tools other than grub-editenv!!!\n");
        }
        let mut v = opts.join(" ");
        if trailing_space {
            v.push(' ');
        }
        let raw: String = v.replace('\\', "\\\\");
        block.push_str(&format!("saved_entry=x\nkernelopts={raw}\nboot_success=0\n"));
        let mut bytes = block.into_bytes();
        bytes.resize(1024, b'#');
        let add = &added()[..n];
        let mut e = grubenv::VarInPlace::new(&bytes, "kernelopts").unwrap().unwrap();
        cmdline::edit_in_place(&mut e, &[], add).unwrap();
        prop_assert_eq!(e.bytes.len(), 1024);
        let value = grubenv::get(&e.bytes, "kernelopts").unwrap().unwrap();
        prop_assert_eq!(Cmdline::parse(&value), Cmdline::parse(&v).apply(&[], add));
        prop_assert_eq!(value.ends_with(' '), trailing_space);
        // only the value line changed before the padding
        let head = |b: &[u8]| b.split(|c| *c == b'\n').take(3 + usize::from(warning)).map(<[u8]>::to_vec).collect::<Vec<_>>();
        prop_assert_eq!(head(&e.bytes)[..2 + usize::from(warning)].to_vec(), head(&bytes)[..2 + usize::from(warning)].to_vec());
        cmdline::edit_in_place(&mut e, add, &[]).unwrap();
        prop_assert_eq!(e.bytes, bytes);
    }
}

// Through the real daemon, on fixture copies: one hand-written variant per format,
// applied, read back as its reader reads it, then dropped from the spec.

mod common;

use common::{Node, apply, change, coverage};
use inplace_wire::pb::Phase;

/// Replaces the first `from` of a sysroot file with `to`.
fn rewrite(node: &Node, path: &str, from: &str, to: &str) -> Vec<u8> {
    let t = node.read(path);
    assert!(t.contains(from), "{path} lacks {from:?}");
    let t = t.replacen(from, to, 1);
    std::fs::write(node.path(path), &t).unwrap();
    t.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_mixed_quoting_and_bom_survive_apply_and_drop() {
    let mut node = Node::new("ubuntu-2404-grub");
    // the edit of the default itself (trials: tests/kernel_args_trial.rs)
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    let orig = node.read("/etc/default/grub");
    // sh does not skip a byte-order mark: before a comment line without shell syntax it
    // is only a "command not found"; before the fixture's own first line (with a `(`) it
    // is a syntax error, refused for that reason
    let bom_first = format!("\u{feff}{orig}");
    let e = grub_default::read_var(&bom_first, "GRUB_CMDLINE_LINUX").unwrap_err();
    assert!(e.to_string().contains("byte-order mark"), "{e}");
    let hand = format!(
        "\u{feff}# tuned by hand\n{}",
        orig.replacen(
            "GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt\"",
            "GRUB_CMDLINE_LINUX='intel_iommu=on'\\ \"iommu=pt\"  # tuned by hand",
            1
        )
    );
    std::fs::write(node.path("/etc/default/grub"), &hand).unwrap();
    node.start();
    let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "one").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let now = node.read("/etc/default/grub");
    assert_eq!(
        now,
        hand.replacen("\"iommu=pt\"", "\"iommu=pt isolcpus=2-7\"", 1)
    );
    assert_eq!(
        bash_value(&now, "GRUB_CMDLINE_LINUX"),
        "intel_iommu=on iommu=pt isolcpus=2-7"
    );
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read("/etc/default/grub"), hand);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bls_options_over_two_crlf_lines_survive_apply_and_drop() {
    let mut node = Node::new("fedora-41-bls");
    // the edit of the default itself (trials: tests/kernel_args_trial.rs)
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    let entry = "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf";
    let t = node.read(entry).replace('\n', "\r\n");
    let t = t.replacen(" no_timer_check ", "  \r\noptions    no_timer_check ", 1);
    std::fs::write(node.path(entry), &t).unwrap();
    node.start();
    let r = coverage(&node, "kernelArgs: [isolcpus=2-7]\n").await;
    let reason = &change(&r, "kernelArgs[isolcpus]").reason;
    let id = "60427531c86a90c5034f2e849abe07c5";
    assert!(
        reason.ends_with(&format!(
            "boots with the change: {id}-6.15.9-201.fc41.x86_64.conf (its options line), \
             {id}-6.14.11-200.fc41.x86_64.conf (its options line); \
             left alone: {id}-0-rescue.conf (rescue entry, its own options)"
        )),
        "{reason}"
    );
    let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "one").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let now = node.read(entry);
    assert_eq!(
        now,
        t.replacen(
            "transparent_hugepage=madvise\r\n",
            "transparent_hugepage=madvise isolcpus=2-7\r\n",
            1
        )
    );
    let e = bls::Entry::parse("x.conf", &now).unwrap();
    assert!(e.options().unwrap().ends_with("madvise isolcpus=2-7"));
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(entry), t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rhel8_rescue_entry_reading_kernelopts_is_named_and_grubenv_restored() {
    let mut node = Node::new("rhel8-grubenv");
    // the edit of the default itself (trials: tests/kernel_args_trial.rs)
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    node.start();
    let r = coverage(&node, "kernelArgs: [isolcpus=2-7]\n").await;
    let c = change(&r, "kernelArgs[isolcpus]");
    assert!(c.covered, "{c:#?}");
    let id = "9f729ae13c6cc2d5038fc425ba3fcd7e";
    assert!(
        c.reason.contains(&format!(
            "boots with the change: {id}-4.18.0-553.58.1.el8_10.x86_64.conf (through $kernelopts in /boot/grub2/grubenv), {id}-4.18.0-553.51.1.el8_10.x86_64.conf (its options line), {id}-0-rescue.conf (rescue entry, through $kernelopts in /boot/grub2/grubenv)"
        )),
        "{}",
        c.reason
    );
    let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "one").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let now = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    assert_eq!(now.len(), 1024);
    assert_eq!(
        grubenv::get(&now, "kernelopts").unwrap().unwrap(),
        "root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet \
         systemd.unified_cgroup_hierarchy=1 isolcpus=2-7 "
    );
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(
        std::fs::read(node.path("/boot/grub2/grubenv")).unwrap(),
        env
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_env_continuation_line_survives_apply_and_drop() {
    let mut node = Node::new("ubuntu-2404-grub");
    // the edit of the default itself (trials: tests/kernel_args_trial.rs)
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    let p = "/var/lib/kubelet/kubeadm-flags.env";
    let t = rewrite(&node, p, "--max-pods=110 ", "--max-pods=110 \\\n  ");
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n    serialize-image-pulls: \"false\"\n";
    let op = apply(&node, yaml, "one").await;
    assert!(
        matches!(Phase::try_from(op.phase), Ok(Phase::Succeeded)),
        "{op:?}"
    );
    let now = node.read(p);
    let want = String::from_utf8(t.clone())
        .unwrap()
        .replacen("--max-pods=110", "--max-pods=250", 1)
        .replacen(
            "edge-1-cp-7xk2p\"",
            "edge-1-cp-7xk2p --serialize-image-pulls=false\"",
            1,
        );
    assert_eq!(now, want);
    let op = apply(&node, "{}\n", "drop").await;
    assert!(
        matches!(Phase::try_from(op.phase), Ok(Phase::Succeeded)),
        "{op:?}"
    );
    assert_eq!(node.read(p).into_bytes(), t);
}

/// `/etc/default/grub` without the variable at all, with and without a final newline: the
/// agent appends the assignment after its marker line, grub-mkconfig's reading (bash) has
/// the argument, and dropping it gives back the original bytes, not `GRUB_CMDLINE_LINUX=""`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_without_the_variable_gets_it_and_loses_it_again() {
    for final_newline in [true, false] {
        let mut node = Node::new("ubuntu-2404-grub");
        // the edit of the default itself (trials: tests/kernel_args_trial.rs)
        std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
        let orig = node.read("/etc/default/grub");
        let line = orig
            .lines()
            .find(|l| l.starts_with("GRUB_CMDLINE_LINUX="))
            .unwrap()
            .to_owned();
        let mut hand = orig.replacen(&format!("{line}\n"), "", 1);
        if !final_newline {
            hand = hand.trim_end_matches('\n').to_owned();
        }
        assert!(!grub_default::assigns(&hand, "GRUB_CMDLINE_LINUX"));
        std::fs::write(node.path("/etc/default/grub"), &hand).unwrap();
        node.start();
        let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "one").await;
        assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
        let now = node.read("/etc/default/grub");
        assert!(now.starts_with(&hand), "{now}");
        assert!(
            now.ends_with("\nGRUB_CMDLINE_LINUX=\"isolcpus=2-7\"\n"),
            "{now}"
        );
        assert_eq!(bash_value(&now, "GRUB_CMDLINE_LINUX"), "isolcpus=2-7");
        let op = apply(&node, "{}\n", "drop").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        assert_eq!(
            node.read("/etc/default/grub"),
            hand,
            "final newline {final_newline}"
        );
    }
}

/// A `kubeadm-flags.env` that assigns no `KUBELET_KUBEADM_ARGS` (only a comment): the flag
/// goes on an appended line, and dropping it restores the file byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_env_without_the_variable_gets_it_and_loses_it_again() {
    let mut node = Node::new("ubuntu-2404-grub");
    // the edit of the default itself (trials: tests/kernel_args_trial.rs)
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    let p = "/var/lib/kubelet/kubeadm-flags.env";
    let hand = "# kubeadm wrote no flags on this node\r\nOTHER='x y'";
    std::fs::write(node.path(p), hand).unwrap();
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n";
    let op = apply(&node, yaml, "one").await;
    assert!(
        matches!(Phase::try_from(op.phase), Ok(Phase::Succeeded)),
        "{op:?}"
    );
    let now = node.read(p);
    assert!(now.starts_with(hand), "{now}");
    assert!(
        now.ends_with("\nKUBELET_KUBEADM_ARGS=\"--max-pods=250\"\n"),
        "{now}"
    );
    let op = apply(&node, "{}\n", "drop").await;
    assert!(
        matches!(Phase::try_from(op.phase), Ok(Phase::Succeeded)),
        "{op:?}"
    );
    assert_eq!(node.read(p), hand);
}
