use super::*;

fn unit(ids: &[&str]) -> DiffUnit {
    DiffUnit {
        ids: ids.iter().map(|s| s.to_string()).collect(),
        ..DiffUnit::open(&["spec".to_string(), "files".to_string()])
    }
}

/// The capability family of an id as `capability_coverage` chose it before it parsed ids.
fn old_family(id: &str) -> Capability {
    if id == translate::VERSION_ID {
        Capability::KubernetesVersion
    } else if id.starts_with("kubelet.flags[") {
        Capability::KubeletExtraArgs
    } else if id == "ntp" {
        Capability::Ntp
    } else {
        Capability::Files
    }
}

/// The flags of `units`, as `capability_coverage` and `set_disruption` read them before.
fn old_flags(units: &[DiffUnit]) -> Vec<String> {
    units
        .iter()
        .flat_map(|u| &u.ids)
        .filter_map(|id| id.strip_prefix("kubelet.flags[")?.strip_suffix(']'))
        .map(String::from)
        .collect()
}

/// Every id the translation writes (files, drop-ins and their items, kubelet flags, ntp,
/// the version), and odd but well-formed ones.
const IDS: [&str; 12] = [
    "files[/etc/a]",
    "files[/etc/a]b]",
    "dropins[10-a.yaml]",
    "sysctls[vm.x]",
    "kubelet.flags[max-pods]",
    "kubelet.flags[cpu-manager-policy]",
    "kubelet.flags[reserved-memory]",
    "kubelet.flags[]",
    "ntp",
    "kubernetes.version",
    "kernelArgs[a]",
    "kubelet.config.maxPods",
];

#[test]
fn capability_coverage_reads_ids_as_before() {
    let units = vec![unit(&IDS[..6]), unit(&IDS[6..])];
    let cov = capability_coverage(&[], &units);
    for id in IDS {
        let why = cov.changes[id].clone().unwrap_err();
        let family = format!("the {:?} capability", old_family(id));
        assert!(why.contains(&family), "{id}: {why}");
    }
    let old_unavailable: std::collections::BTreeSet<String> = old_flags(&units)
        .into_iter()
        .filter(|f| {
            !inplace_formats::kubelet::checkpoints::kubelet_state_files(&[f.as_str()], true)
                .is_empty()
        })
        .map(|f| format!("kubelet.flags[{f}]"))
        .collect();
    assert_eq!(cov.unavailable, old_unavailable);
    assert_eq!(cov.unavailable.len(), 2);
    assert_eq!(kubelet_flags(&units), old_flags(&units));
    // all covered when every family is declared
    let all = [
        Capability::Files,
        Capability::KubeletExtraArgs,
        Capability::Ntp,
        Capability::KubernetesVersion,
    ];
    let cov = capability_coverage(&all, &units);
    assert!(cov.changes.values().all(Result::is_ok));
}

/// The one input on which the parse differs from the old prefix test: a flag id without
/// its `]`, which the translation never writes (it writes `kubelet.flags[<name>]`).
#[test]
fn a_flag_id_without_its_bracket_is_not_a_flag() {
    let cov = capability_coverage(&[], &[unit(&["kubelet.flags[x"])]);
    assert!(
        cov.changes["kubelet.flags[x"]
            .clone()
            .unwrap_err()
            .contains("the Files capability")
    );
    assert_eq!(old_family("kubelet.flags[x"), Capability::KubeletExtraArgs);
}

/// The `answer` label before it was typed: read from the message.
fn old_answer(preserve: bool, msg: &str) -> Verdict {
    if preserve {
        Verdict::Preserve
    } else if msg.contains("not covered: ") {
        Verdict::NotCovered
    } else if msg.contains("in place: ") {
        Verdict::Covered
    } else {
        Verdict::NoChanges
    }
}

#[test]
fn verdicts_say_what_the_message_says() {
    let covered = || vec![unit(&["files[/etc/a]"])];
    let uncovered = || vec![("spec.ntp".to_string(), "ntp: no".to_string())];
    let decisions = [
        Decision::default(),
        Decision {
            covered: covered(),
            uncovered: vec![],
        },
        Decision {
            covered: vec![],
            uncovered: uncovered(),
        },
        Decision {
            covered: covered(),
            uncovered: uncovered(),
        },
    ];
    for d in &decisions {
        for preserve in [false, true] {
            let preserve = preserve && !d.uncovered.is_empty();
            let reasons = ["bare metal".to_string()];
            let msg = message("m-1", d, "", preserve.then_some(&reasons[..]));
            assert_eq!(
                Verdict::of(d, preserve),
                old_answer(preserve, &msg),
                "{msg}"
            );
        }
    }
    // the Machine's name is not read as an answer any more
    let msg = message("keep in place: x", &Decision::default(), "", None);
    assert_eq!(old_answer(false, &msg), Verdict::Covered);
    assert_eq!(Verdict::of(&Decision::default(), false), Verdict::NoChanges);
}
