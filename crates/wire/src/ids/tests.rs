use super::*;
use proptest::prelude::*;

/// Every id form, as the agent's sections write it, with its parse.
fn forms() -> Vec<(&'static str, ChangeId)> {
    let s = String::from;
    vec![
        ("files[/etc/x]", ChangeId::File(s("/etc/x"))),
        ("files[/etc/a]b[c]]", ChangeId::File(s("/etc/a]b[c]"))),
        ("files[]", ChangeId::File(s(""))),
        ("dropins[10-site.yaml]", ChangeId::DropIn(s("10-site.yaml"))),
        (
            "kubelet.flags[max-pods]",
            ChangeId::KubeletFlag(s("max-pods")),
        ),
        ("sysctls[vm.x]", ChangeId::Sysctl(s("vm.x"))),
        (
            "sysctls[net.ipv4.ip_forward]",
            ChangeId::Sysctl(s("net.ipv4.ip_forward")),
        ),
        ("kernelArgs[hugepages]", ChangeId::KernelArg(s("hugepages"))),
        ("kernelArgs", ChangeId::KernelArgs),
        ("ntp", ChangeId::Ntp),
        ("kubernetes.version", ChangeId::KubernetesVersion),
        ("kubelet.config", ChangeId::KubeletConfig(vec![])),
        (
            "kubelet.config.maxPods",
            ChangeId::KubeletConfig(vec![s("maxPods")]),
        ),
        (
            r#"kubelet.config.evictionHard["memory.available"]"#,
            ChangeId::KubeletConfig(vec![s("evictionHard"), s("memory.available")]),
        ),
        (
            r#"kubelet.config["a]b"].c[""]["q\"\\"]"#,
            ChangeId::KubeletConfig(vec![s("a]b"), s("c"), s(""), s("q\"\\")]),
        ),
    ]
}

/// The agent's `sections::kubelet::config_id`, as it is (the id Display must write).
fn agent_config_id(path: &[String]) -> String {
    let mut id = String::from("kubelet.config");
    for seg in path {
        if seg.contains(['.', '[', ']', '"']) || seg.is_empty() {
            id.push_str(&format!(
                "[{}]",
                serde_json::to_string(seg).unwrap_or_default()
            ));
        } else {
            id.push('.');
            id.push_str(seg);
        }
    }
    id
}

/// The agent's `metrics::section_of` before it parsed ids.
fn old_section_of(id: &str) -> &str {
    let end = id.find(['[', '.']).unwrap_or(id.len());
    &id[..end]
}

#[test]
fn every_form_round_trips() {
    for (text, id) in forms() {
        assert_eq!(ChangeId::parse(text).as_ref(), Ok(&id), "{text}");
        assert_eq!(id.to_string(), text);
        assert_eq!(text.parse::<ChangeId>(), Ok(id));
    }
}

#[test]
fn what_is_not_an_id_is_refused() {
    for text in [
        "",
        "files[/etc/x",
        "files",
        "kubelet",
        "kubelet.flags",
        "kubelet.configx",
        "kubelet.config.",
        "kubelet.config..a",
        "kubelet.config[a]",
        r#"kubelet.config["a""#,
        r#"kubelet.config["a"]x"#,
        "kubernetes",
        "ntp.servers",
        "Ntp",
    ] {
        let e = ChangeId::parse(text).expect_err(text);
        assert_eq!(e.0, text);
    }
}

#[test]
fn sections_are_the_old_prefix_rule() {
    let malformed = [
        "files[/x",
        "foo.bar[1]",
        "",
        "x",
        "kubelet.config..a",
        "a[b.c]",
    ];
    for text in forms().iter().map(|(t, _)| *t).chain(malformed) {
        assert_eq!(section_of(text), old_section_of(text), "{text}");
    }
    assert_eq!(section_of("kubelet.config.maxPods"), "kubelet");
    assert_eq!(section_of("kubernetes.version"), "kubernetes");
}

#[test]
fn saved_originals_are_told_apart() {
    assert!(is_saved_original(&saved_original_action("/etc/x")));
    // the agent's text (apply/engine.rs), and the extension's old prefix
    assert!(is_saved_original("saved original of /etc/chrony.conf"));
    for other in [
        "removed /etc/x",
        "set sysctl vm.x (live)",
        "saved the previous /etc/x as /y",
    ] {
        assert!(!is_saved_original(other), "{other}");
    }
}

proptest! {
    #[test]
    fn bracketed_ids_round_trip(s in ".*", form in 0usize..5) {
        let id = (BRACKETED[form].1)(s);
        prop_assert_eq!(ChangeId::parse(&id.to_string()), Ok(id));
    }

    #[test]
    fn kubelet_config_ids_round_trip_as_the_agent_writes_them(
        path in proptest::collection::vec("[a-z.\\[\\]\"\\\\ ]{0,6}", 0..4)
    ) {
        let id = ChangeId::KubeletConfig(path.clone());
        prop_assert_eq!(id.to_string(), agent_config_id(&path));
        prop_assert_eq!(ChangeId::parse(&agent_config_id(&path)), Ok(id));
    }

    #[test]
    fn section_of_any_string_is_the_old_one(s in "[a-zA-Z.\\[\\]/\"]{0,12}") {
        prop_assert_eq!(section_of(&s), old_section_of(&s));
    }
}

/// Every variant of [`ChangeId`] is among [`forms`], so its `parse` arm is tested (the
/// compiler forces `Display` and `section()` arms, not `parse`). The match below has no
/// wildcard: a new variant does not compile until it is named there; name it in `ALL`
/// too, and the test fails until `forms` holds a text of it that parses.
#[test]
fn every_variant_has_a_form_that_parses() {
    fn variant(id: &ChangeId) -> &'static str {
        match id {
            ChangeId::File(_) => "File",
            ChangeId::DropIn(_) => "DropIn",
            ChangeId::KubeletFlag(_) => "KubeletFlag",
            ChangeId::KubeletConfig(_) => "KubeletConfig",
            ChangeId::Sysctl(_) => "Sysctl",
            ChangeId::KernelArg(_) => "KernelArg",
            ChangeId::KernelArgs => "KernelArgs",
            ChangeId::Ntp => "Ntp",
            ChangeId::KubernetesVersion => "KubernetesVersion",
        }
    }
    const ALL: [&str; 9] = [
        "File",
        "DropIn",
        "KubeletFlag",
        "KubeletConfig",
        "Sysctl",
        "KernelArg",
        "KernelArgs",
        "Ntp",
        "KubernetesVersion",
    ];
    let listed: std::collections::BTreeSet<&str> =
        forms().iter().map(|(_, id)| variant(id)).collect();
    for v in ALL {
        assert!(listed.contains(v), "ChangeId::{v} has no form in forms()");
    }
    assert_eq!(listed.len(), ALL.len());
}
