//! Issue 20 §1 for the KubeletConfiguration file: over generated layouts the kubelet
//! accepts (CRLF, a byte-order mark, comments, flow and block mappings and sequences,
//! quoted and plain scalars, document markers, trailing whitespace), an edit keeps every
//! untouched byte, a YAML 1.2 reader (serde-saphyr) reads the intended value and type,
//! and the planner's revert (the recorded source text, or a removal) gives back the
//! original bytes.

use super::*;
use proptest::prelude::*;

/// One generated document: the pieces the edit must not touch, and the fields it edits.
#[derive(Debug, Clone)]
struct Layout {
    bom: bool,
    crlf: bool,
    head_comment: bool,
    doc_start: bool,
    doc_end: bool,
    /// `featureGates` written `{A: true, B: false}` rather than as a block.
    gates_flow: bool,
    gates: Vec<bool>,
    /// `clusterDomain`: 0 plain, 1 single-quoted, 2 double-quoted.
    domain_style: u8,
    /// Untouched entries between the edited ones, each as whole lines.
    others: Vec<String>,
    trailing_ws: bool,
}

fn other_entries() -> impl Strategy<Value = Vec<String>> {
    let one = prop_oneof![
        Just("cgroupDriver: systemd # the runtime's driver\n".to_string()),
        Just("clusterDNS:\n- 10.96.0.10\n".to_string()),
        Just("clusterDNS:\n  - 10.96.0.10 # indented\n  - \"fd00::a\"\n".to_string()),
        Just("tlsCipherSuites: [TLS_AES_128_GCM_SHA256, 'TLS_AES_256_GCM_SHA384']\n".to_string()),
        Just("evictionHard: {memory.available: \"100Mi\", nodefs.available: '10%'}\n".to_string()),
        Just(
            "systemReserved:\n  # reserved for the OS\n  cpu: 500m\n  memory: \"1Gi\"\n"
                .to_string()
        ),
        Just(
            "logging:\n  format: text\n  options:\n    json:\n      infoBufferSize: \"0\"\n"
                .to_string()
        ),
        Just("# a comment line between fields\n".to_string()),
        Just("staticPodPath: '/etc/kubernetes/manifests'\n".to_string()),
        Just("maxPods: 110\n".to_string()),
    ];
    proptest::collection::vec(one, 0..4).prop_map(|mut v| {
        // one definition of each field (the kubelet rejects duplicates)
        let mut seen = std::collections::HashSet::new();
        v.retain(|e| seen.insert(e.split(':').next().unwrap_or("").to_string()));
        v
    })
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        any::<bool>(),
        proptest::collection::vec(any::<bool>(), 1..4),
        0u8..3,
        other_entries(),
        any::<bool>(),
    )
        .prop_map(
            |((bom, crlf, head_comment, doc_start, doc_end), gates_flow, gates, ds, others, tw)| {
                Layout {
                    bom,
                    crlf,
                    head_comment,
                    doc_start,
                    doc_end,
                    gates_flow,
                    gates,
                    domain_style: ds,
                    others,
                    trailing_ws: tw,
                }
            },
        )
}

/// The text of a layout, and the untouched pieces (in the LF form) that must survive.
fn render(l: &Layout) -> (String, Vec<String>) {
    let mut keep = Vec::new();
    let mut t = String::new();
    if l.head_comment {
        t.push_str("# written by kubeadm\n");
    }
    if l.doc_start {
        t.push_str("---\n");
    }
    keep.push(t.clone());
    t.push_str("apiVersion: kubelet.config.k8s.io/v1beta1\n");
    let domain = ["cluster.local", "'cluster.local'", "\"cluster.local\""][l.domain_style as usize];
    let ws = if l.trailing_ws { "  " } else { "" };
    t.push_str(&format!("clusterDomain: {domain}{ws}\n"));
    let (a, b) = l.others.split_at(l.others.len() / 2);
    for o in a {
        keep.push(o.clone());
        t.push_str(o);
    }
    let gate = |i: usize| format!("Gate{i}");
    if l.gates_flow {
        let items: Vec<String> = l
            .gates
            .iter()
            .enumerate()
            .map(|(i, g)| format!("{}: {g}", gate(i)))
            .collect();
        t.push_str(&format!("featureGates: {{{}}} # gates\n", items.join(", ")));
    } else {
        t.push_str("featureGates: # gates\n");
        for (i, g) in l.gates.iter().enumerate() {
            t.push_str(&format!("  {}: {g}{ws}\n", gate(i)));
        }
    }
    let kind = "kind: KubeletConfiguration\n".to_string();
    keep.push(kind.clone());
    t.push_str(&kind);
    for o in b {
        keep.push(o.clone());
        t.push_str(o);
    }
    if l.doc_end {
        t.push_str("...\n");
        keep.push("...\n".into());
    }
    if l.crlf {
        t = t.replace('\n', "\r\n");
        for k in &mut keep {
            *k = k.replace('\n', "\r\n");
        }
    }
    if l.bom {
        t.insert(0, '\u{FEFF}');
    }
    (t, keep)
}

fn path(s: &str) -> FieldPath {
    s.split('.').map(String::from).collect()
}

/// The edits the planner would make for a spec, and their reverts as the planner builds
/// them from the record (prior source text, or a removal when the field was absent).
fn edits_and_reverts(
    text: &str,
    flips: &[usize],
    gates: &[bool],
    new_gates: usize,
    domain: Option<&str>,
) -> (Vec<LeafEdit>, Vec<LeafEdit>) {
    let doc = parse(text).unwrap();
    let mut sets: Vec<(FieldPath, Value)> = Vec::new();
    for &i in flips {
        let i = i % gates.len();
        sets.push((
            path(&format!("featureGates.Gate{i}")),
            Value::Bool(!gates[i]),
        ));
    }
    for j in 0..new_gates {
        sets.push((
            path(&format!("featureGates.NewGate{j}")),
            Value::Bool(j % 2 == 0),
        ));
    }
    if let Some(d) = domain {
        sets.push((path("clusterDomain"), Value::String(d.into())));
    }
    let mut uniq = std::collections::HashSet::new();
    sets.retain(|(p, _)| uniq.insert(p.clone()));
    let raws = raw_scalars(text, sets.iter().map(|(p, _)| &p[..]));
    let mut reverts = Vec::new();
    for ((p, _), raw) in sets.iter().zip(raws) {
        reverts.push(match (get(&doc, p), raw) {
            (Some(v), Some(r)) => LeafEdit::SetRaw(p.clone(), v.clone(), r),
            (Some(v), None) => LeafEdit::Set(p.clone(), v.clone()),
            (None, _) => LeafEdit::Remove(p.clone()),
        });
    }
    let edits = sets.into_iter().map(|(p, v)| LeafEdit::Set(p, v)).collect();
    (edits, reverts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn yaml_layouts_edit_faithfully_and_revert_exactly(
        l in layout(),
        flips in proptest::collection::vec(0usize..4, 0..3),
        new_gates in 0usize..3,
        domain in proptest::option::of(prop_oneof![
            Just("example.internal"), Just("on"), Just("it's"), Just("a,b"), Just("0644"),
        ]),
    ) {
        prop_assume!(!flips.is_empty() || new_gates > 0 || domain.is_some());
        let (text, keep) = render(&l);
        let (edits, reverts) = edits_and_reverts(&text, &flips, &l.gates, new_gates, domain);
        let out = edit(&text, &edits).unwrap();
        prop_assert!(out.faithful, "re-rendered:\n{}", out.text);
        // (a) untouched bytes: the BOM, every untouched piece, the line endings
        prop_assert_eq!(out.text.starts_with('\u{FEFF}'), l.bom);
        for k in &keep {
            prop_assert!(out.text.contains(k.as_str()), "lost {:?} in\n{}", k, out.text);
        }
        if l.crlf {
            prop_assert!(!out.text.replace("\r\n", "").contains('\n'), "LF in a CRLF file:\n{:?}", out.text);
        }
        // (b) what a YAML 1.2 reader (and the kubelet's go-yaml v2) reads back
        let body = out.text.trim_start_matches('\u{FEFF}');
        let read: Value = serde_saphyr::from_str(body).unwrap();
        let ours = parse(&out.text).unwrap();
        for e in &edits {
            let LeafEdit::Set(p, v) = e else { unreachable!() };
            prop_assert_eq!(get(&read, p), Some(v), "serde-saphyr reads {:?}", p);
            prop_assert_eq!(get(&ours, p), Some(v), "go-yaml v2 rules read {:?}", p);
        }
        prop_assert_eq!(get(&read, &path("kind")), Some(&Value::from("KubeletConfiguration")));
        // (c) the revert gives back the original bytes
        let back = edit(&out.text, &reverts).unwrap();
        prop_assert_eq!(&back.text, &text, "after\n{}", out.text);
    }
}
