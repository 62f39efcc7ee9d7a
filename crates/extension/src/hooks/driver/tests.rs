use super::*;

#[test]
fn attempts_restart_only_when_the_node_moved_on() {
    let op = |id: &str, phase: Phase, hash: &str| pb::Operation {
        id: id.into(),
        phase: phase as i32,
        spec_hash: hash.into(),
        ..Default::default()
    };
    let st = |hash: &str| pb::NodeStatus {
        applied_spec_hash: hash.into(),
        ..Default::default()
    };
    assert_eq!(choose_attempt("u", &[], &st("")).0.as_deref(), Some("u"));
    let done = [op("u", Phase::Succeeded, "h")];
    assert_eq!(choose_attempt("u", &done, &st("h")).0, None);
    assert_eq!(
        choose_attempt("u", &done, &st("other")).0.as_deref(),
        Some("u-r1")
    );
    // a stale failure, fixed forward by another operation since
    let stale = [
        op("x", Phase::Succeeded, "x"),
        op("u-r1", Phase::Failed, "h"),
    ];
    assert_eq!(
        choose_attempt("u", &stale, &st("x")).0.as_deref(),
        Some("u-r2")
    );
    // a timed try the agent reverted (not confirmed) is a failure, not a stale one: its
    // own revert is no fix-forward, so no new attempt starts
    let reverted = [
        op("u-r1.revert", Phase::Succeeded, "x"),
        op("u-r1", Phase::RolledBack, "h"),
    ];
    let (start, newest) = choose_attempt("u", &reverted, &st("x"));
    assert_eq!(
        (start, newest.map(|o| o.id)),
        (None, Some("u-r1".to_string()))
    );
    let failed = [op("u", Phase::Failed, "h")];
    let (start, newest) = choose_attempt("u", &failed, &st("h"));
    assert_eq!((start, newest.map(|o| o.id)), (None, Some("u".to_string())));
}

#[test]
fn drop_item_names_single_items() {
    let mut s = pb::NodeSpec {
        files: vec![pb::File {
            path: "/etc/a".into(),
            ..Default::default()
        }],
        ntp: Some(pb::Ntp {
            servers: vec!["n".into()],
        }),
        ..Default::default()
    };
    assert!(drop_item(&mut s, "files[/etc/a]"));
    assert!(s.files.is_empty());
    assert!(drop_item(&mut s, "ntp"));
    assert!(!drop_item(&mut s, "sysctls[vm.x]"));
}

/// `drop_item` as it was before it parsed ids with [`ChangeId`].
fn old_drop_item(spec: &mut pb::NodeSpec, id: &str) -> bool {
    let inner = |p: &str| {
        id.strip_prefix(p)
            .and_then(|r| r.strip_suffix(']'))
            .map(String::from)
    };
    if let Some(p) = inner("files[") {
        let n = spec.files.len();
        spec.files.retain(|f| f.path != p);
        return spec.files.len() < n;
    }
    if let Some(n) = inner("kubelet.flags[") {
        return spec
            .kubelet
            .as_mut()
            .is_some_and(|k| k.flags.remove(&n).is_some());
    }
    if let Some(n) = inner("dropins[") {
        let before = spec.dropins.len();
        spec.dropins.retain(|d| d.name != n);
        return spec.dropins.len() < before;
    }
    if id == "ntp" {
        return spec.ntp.take().is_some();
    }
    false
}

#[test]
fn drop_item_does_what_it_did_before_ids_were_parsed() {
    let spec = pb::NodeSpec {
        files: vec![
            pb::File {
                path: "/etc/a".into(),
                ..Default::default()
            },
            pb::File {
                path: "/etc/b]c".into(),
                ..Default::default()
            },
            pb::File {
                path: String::new(),
                ..Default::default()
            },
        ],
        kubelet: Some(pb::Kubelet {
            flags: [("max-pods".to_string(), "110".to_string())].into(),
            config: None,
        }),
        dropins: vec![pb::DropIn {
            name: "10-a.yaml".into(),
            ..Default::default()
        }],
        ntp: Some(pb::Ntp {
            servers: vec!["n".into()],
        }),
        sysctls: [("vm.x".to_string(), "1".to_string())].into(),
        ..Default::default()
    };
    let ids = [
        "files[/etc/a]",
        "files[/etc/b]c]",
        "files[]",
        "files[/etc/none]",
        "files[/etc/a",
        "kubelet.flags[max-pods]",
        "kubelet.flags[other]",
        "kubelet.config.maxPods",
        "dropins[10-a.yaml]",
        "dropins[10-b.yaml]",
        "ntp",
        "ntp.servers",
        "sysctls[vm.x]",
        "kernelArgs[a]",
        "kernelArgs",
        "kubernetes.version",
        "",
    ];
    for id in ids {
        let (mut old, mut new) = (spec.clone(), spec.clone());
        assert_eq!(drop_item(&mut new, id), old_drop_item(&mut old, id), "{id}");
        assert_eq!(new, old, "{id}");
    }
}

#[test]
fn done_names_the_changes_without_saved_originals() {
    let op = |actions: &[&str]| pb::Operation {
        actions: actions.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    assert_eq!(
        changed(&op(&[
            "saved original of /etc/x",
            "wrote /etc/x",
            "try-restarted kubelet.service"
        ])),
        "wrote /etc/x, try-restarted kubelet.service"
    );
    assert_eq!(
        changed(&op(&["saved original of /etc/x"])),
        "nothing to change"
    );
    assert_eq!(changed(&op(&[])), "nothing to change");
}
