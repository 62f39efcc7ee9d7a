//! Faithful-edit tests of the KubeletConfiguration editor, on the four node fixtures.

use super::*;
use proptest::prelude::*;
use serde_json::json;

const FIXTURES: &[(&str, &str)] = &[
    (
        "fedora-41-bls",
        include_str!(
            "../../../../../tests/fixtures/nodes/fedora-41-bls/var/lib/kubelet/config.yaml"
        ),
    ),
    (
        "rhel8-grubenv",
        include_str!(
            "../../../../../tests/fixtures/nodes/rhel8-grubenv/var/lib/kubelet/config.yaml"
        ),
    ),
    (
        "systemd-boot",
        include_str!(
            "../../../../../tests/fixtures/nodes/systemd-boot/var/lib/kubelet/config.yaml"
        ),
    ),
    (
        "ubuntu-2404-grub",
        include_str!(
            "../../../../../tests/fixtures/nodes/ubuntu-2404-grub/var/lib/kubelet/config.yaml"
        ),
    ),
];

fn p(s: &str) -> FieldPath {
    s.split('.').map(String::from).collect()
}

fn set(path: &str, v: Value) -> LeafEdit {
    LeafEdit::Set(p(path), v)
}

fn expected_after(text: &str, edits: &[LeafEdit]) -> Value {
    let mut v = parse(text).unwrap();
    for e in edits {
        apply(&mut v, e).unwrap();
    }
    v
}

#[test]
fn fixtures_parse() {
    for (name, text) in FIXTURES {
        let v = parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(v["kind"], json!("KubeletConfiguration"), "{name}");
        assert_eq!(v["healthzBindAddress"], json!("127.0.0.1"), "{name}");
        assert_eq!(v["healthzPort"], json!(10248), "{name}");
        assert_eq!(v["authentication"]["anonymous"]["enabled"], json!(false));
        assert_eq!(
            v["logging"]["options"]["json"]["infoBufferSize"],
            json!("0")
        );
        assert_eq!(v["crashLoopBackOff"], json!({}));
        assert!(v["clusterDNS"].is_array());
    }
    let rhel = parse(FIXTURES[1].1).unwrap();
    assert_eq!(rhel["containerRuntimeEndpoint"], json!(""));
    assert_eq!(rhel["clusterDNS"], json!(["10.112.0.10"]));
}

#[test]
fn a_max_pods_and_system_reserved_are_surgical() {
    for (name, text) in FIXTURES {
        let edits = [
            set("maxPods", json!(250)),
            set("systemReserved.cpu", json!("500m")),
        ];
        let out = edit(text, &edits).unwrap();
        assert!(out.faithful, "{name}");
        let mut want = text.replacen("memorySwap: {}\n", "maxPods: 250\nmemorySwap: {}\n", 1);
        if !text.contains("systemReserved:") {
            want = want.replacen(
                "volumeStatsAggPeriod:",
                "systemReserved:\n  cpu: 500m\nvolumeStatsAggPeriod:",
                1,
            );
        }
        assert_eq!(out.text, want, "{name}");
        assert_eq!(parse(&out.text).unwrap(), expected_after(text, &edits));
    }
}

#[test]
fn b_ambiguous_strings_are_quoted() {
    let text = FIXTURES[3].1;
    let out = edit(text, &[set("cgroupDriver", json!("on"))]).unwrap();
    assert_eq!(
        out.text,
        text.replace("cgroupDriver: systemd", "cgroupDriver: \"on\"")
    );
    let out = edit(text, &[set("featureGates.x", json!("no"))]).unwrap();
    assert!(out.text.contains("featureGates:\n  x: \"no\"\n"));
    assert_eq!(parse(&out.text).unwrap()["featureGates"]["x"], json!("no"));
    for s in [
        "on",
        "no",
        "yes",
        "off",
        "y",
        "Y",
        "n",
        "true",
        "False",
        "null",
        "~",
        "0",
        "1.5",
        "0644",
        "1e3",
        "",
        "0x1F",
        "0o17",
        "1_000",
        "-1",
        ".5",
        ".inf",
        "1:20",
        "2001-12-14",
        " x",
        "x ",
        "a: b",
        "a #b",
        "*a",
        "&a",
        "!a",
        "[a",
        "{a",
        "'a",
        "\"a",
        "%a",
        "@a",
        "`a",
        "|",
        ">",
        "-",
        "- a",
        "? a",
        "a:",
        "---",
        "line\nbreak",
        "tab\t",
        "\u{0}",
        "\u{85}",
        "\u{feff}x",
        "=",
        "<<",
    ] {
        let r = render_scalar(&json!(s));
        assert!(r.starts_with('"'), "{s:?} rendered as {r}");
        let doc = format!("k: {r}\n");
        assert_eq!(parse(&doc).unwrap()["k"], json!(s), "{s:?} via {r}");
    }
    for s in [
        "500m",
        "2m0s",
        "10.96.0.10",
        "systemd",
        "/etc/kubernetes/pki/ca.crt",
        "unix:///var/run/containerd/containerd.sock",
        "memory.available<500Mi",
        "kubelet.config.k8s.io/v1beta1",
        "a,b",
        "-a",
        "x\"y",
        "ünï",
    ] {
        assert_eq!(render_scalar(&json!(s)), s);
    }
    assert_eq!(render_scalar(&json!(250)), "250");
    assert_eq!(render_scalar(&json!(1.5)), "1.5");
    assert_eq!(render_scalar(&json!(true)), "true");
    assert_eq!(render_scalar(&Value::Null), "null");
    assert_eq!(render_scalar(&json!({})), "{}");
    assert_eq!(render_scalar(&json!([])), "[]");
}

#[test]
fn c_edit_then_reverse_restores_bytes() {
    for (name, text) in FIXTURES {
        let orig = parse(text).unwrap();
        let edits = vec![
            set("maxPods", json!(250)),
            set("systemReserved.cpu", json!("500m")),
            set("authentication.webhook.cacheTTL", json!("2m0s")),
            LeafEdit::Set(
                vec!["evictionHard".into(), "memory.available".into()],
                json!("500Mi"),
            ),
            set("crashLoopBackOff.maxContainerRestartPeriod", json!("5m0s")),
            set("cgroupDriver", json!("cgroupfs")),
        ];
        let once = edit(text, &edits).unwrap();
        assert!(once.faithful, "{name}");
        let mut reverse = Vec::new();
        for e in edits.iter().rev() {
            let LeafEdit::Set(path, _) = e else { continue };
            match get(&orig, path) {
                Some(old) => reverse.push(LeafEdit::Set(path.clone(), old.clone())),
                None => reverse.push(LeafEdit::Remove(path.clone())),
            }
        }
        let back = edit(&once.text, &reverse).unwrap();
        assert!(back.faithful, "{name}");
        // crashLoopBackOff: {} becomes a block mapping and removing its only key drops it,
        // so restore it explicitly.
        let back = edit(&back.text, &[set("crashLoopBackOff", json!({}))]).unwrap();
        assert_eq!(back.text, *text, "{name}");
    }
}

#[test]
fn d_nested_scalar_in_place() {
    let text = FIXTURES[0].1;
    let out = edit(
        text,
        &[set("authentication.webhook.cacheTTL", json!("2m0s"))],
    )
    .unwrap();
    assert!(out.faithful);
    assert_eq!(
        out.text,
        text.replacen("    cacheTTL: 0s\n", "    cacheTTL: 2m0s\n", 1)
    );
}

#[test]
fn e_replace_list() {
    let text = FIXTURES[3].1;
    let out = edit(
        text,
        &[set("clusterDNS", json!(["10.96.0.10", "10.96.0.11"]))],
    )
    .unwrap();
    assert!(out.faithful);
    assert_eq!(
        out.text,
        text.replacen(
            "clusterDNS:\n- 10.96.0.10\n",
            "clusterDNS:\n- 10.96.0.10\n- 10.96.0.11\n",
            1
        )
    );
    // List to scalar and back to a nested list of mappings.
    let out = edit(text, &[set("clusterDNS", json!([{"a": 1, "b": [1, 2]}]))]).unwrap();
    assert!(
        out.text
            .contains("clusterDNS:\n- a: 1\n  b:\n  - 1\n  - 2\nclusterDomain")
    );
    assert!(out.faithful);
}

#[test]
fn empty_flow_map_gets_a_block() {
    let text = FIXTURES[3].1;
    let out = edit(
        text,
        &[set(
            "crashLoopBackOff.maxContainerRestartPeriod",
            json!("5m0s"),
        )],
    )
    .unwrap();
    assert!(out.faithful);
    assert_eq!(
        out.text,
        text.replacen(
            "crashLoopBackOff: {}\n",
            "crashLoopBackOff:\n  maxContainerRestartPeriod: 5m0s\n",
            1
        )
    );
}

#[test]
fn quoted_values_stay_quoted_and_untouched() {
    let text = FIXTURES[3].1;
    let out = edit(
        text,
        &[set("logging.options.json.infoBufferSize", json!("1"))],
    )
    .unwrap();
    assert_eq!(
        out.text,
        text.replacen("infoBufferSize: \"0\"", "infoBufferSize: \"1\"", 1)
    );
    let out = edit(
        text,
        &[set("logging.options.text.infoBufferSize", json!("1Mi"))],
    )
    .unwrap();
    assert!(
        out.text
            .contains("      infoBufferSize: \"0\"\n    text:\n      infoBufferSize: \"1Mi\"\n")
    );
    let sq = "a: 'x'\nb: 1\n";
    assert_eq!(
        edit(sq, &[set("a", json!("it's"))]).unwrap().text,
        "a: 'it''s'\nb: 1\n"
    );
    // A number over a quoted string becomes plain.
    assert_eq!(
        edit(sq, &[set("a", json!(3))]).unwrap().text,
        "a: 3\nb: 1\n"
    );
}

#[test]
fn remove_prunes_emptied_parents() {
    let text = FIXTURES[0].1;
    let out = edit(
        text,
        &[
            LeafEdit::Remove(p("kubeReserved.cpu")),
            LeafEdit::Remove(p("kubeReserved.memory")),
        ],
    )
    .unwrap();
    assert!(out.faithful);
    assert_eq!(
        out.text,
        text.replacen("kubeReserved:\n  cpu: 250m\n  memory: 512Mi\n", "", 1)
    );
    // Pre-existing empty mappings are not pruned; absent keys are a no-op.
    let out = edit(text, &[LeafEdit::Remove(p("memorySwap.swapBehavior"))]).unwrap();
    assert_eq!(out.text, *text);
    let out = edit(
        text,
        &[LeafEdit::Remove(p("logging.options.json.infoBufferSize"))],
    )
    .unwrap();
    assert_eq!(
        out.text,
        text.replacen("    json:\n      infoBufferSize: \"0\"\n", "", 1)
    );
    assert_eq!(
        edit("a: 1\n", &[LeafEdit::Remove(p("a"))]).unwrap().text,
        "{}\n"
    );
}

#[test]
fn non_mapping_parent_is_an_error() {
    let text = FIXTURES[3].1;
    let err = edit(text, &[set("clusterDNS.x", json!(1))]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConfigError::ParentNotMapping { .. }), "{msg}");
    assert!(
        msg.contains("clusterDNS.x") && msg.contains("sequence"),
        "{msg}"
    );
    let err = edit(text, &[LeafEdit::Remove(p("cgroupDriver.x"))]).unwrap_err();
    assert!(err.to_string().contains("`cgroupDriver` is a string"));
    assert!(matches!(
        edit(text, &[LeafEdit::Set(vec![], json!(1))]),
        Err(ConfigError::EmptyPath)
    ));
}

#[test]
fn comments_unsorted_and_missing_newline() {
    let text = "# managed\nzeta: 1 # keep\nalpha:\n  # inner\n  b: x\n";
    let out = edit(text, &[set("alpha.c", json!("y")), set("mid", json!(2))]).unwrap();
    assert!(out.faithful);
    assert_eq!(
        out.text,
        "# managed\nzeta: 1 # keep\nalpha:\n  # inner\n  b: x\n  c: \"y\"\nmid: 2\n"
    );
    // A tagged scalar that is replaced as a whole is fine.
    let out = edit("a: !!str 5\nb: 1\n", &[set("a", json!("6"))]).unwrap();
    assert_eq!(out.text, "a: \"6\"\nb: 1\n");
    assert!(out.faithful);
    let out = edit("a: 1\nc: 3", &[set("d", json!(4)), set("b", json!(2))]).unwrap();
    assert_eq!(out.text, "a: 1\nb: 2\nc: 3\nd: 4");
    let out = edit("a: 1 # one\nb: 2", &[set("a", json!(5))]).unwrap();
    assert_eq!(out.text, "a: 5 # one\nb: 2");
    let out = edit("k: 1\r\nm:\r\n  a: 1\r\n", &[set("m.b", json!(2))]).unwrap();
    assert_eq!(out.text, "k: 1\r\nm:\r\n  a: 1\r\n  b: 2\r\n");
    let out = edit("a:\nb: 2\n", &[set("a.x", json!(1))]).unwrap();
    assert_eq!(out.text, "a:\n  x: 1\nb: 2\n");
    assert!(out.faithful);
}

#[test]
fn fallback_for_unsupported_constructs() {
    let cases = [
        ("a: &r\n  x: 1\nb: *r\n", set("a.x", json!(2))),
        ("a: !!map\n  x: 1\nb: 1\n", set("a.y", json!("6"))),
        ("a: |\n  text\nb: 1\n", set("a", json!("x"))),
    ];
    for (text, e) in cases {
        let out = edit(text, std::slice::from_ref(&e)).unwrap();
        assert!(!out.faithful, "{text}");
        assert_eq!(
            parse(&out.text).unwrap(),
            expected_after(text, &[e]),
            "{text}"
        );
    }
    // Anchors away from the edit point do not prevent a faithful edit.
    let text = "a: &r 1\nb: *r\nc: 3\n";
    let out = edit(text, &[set("c", json!(4))]).unwrap();
    assert!(out.faithful);
    assert_eq!(out.text, "a: &r 1\nb: *r\nc: 4\n");
}

#[test]
fn flow_collections_stay_flow() {
    let cases = [
        (
            "a: {x: 1}\nb: 2\n",
            set("a.w", json!(2)),
            "a: {x: 1, w: 2}\nb: 2\n",
        ),
        ("{a: 1, b: 2}\n", set("c", json!(3)), "{a: 1, b: 2, c: 3}\n"),
        (
            "a: {x: 1, w: 'q'}\n",
            set("a.w", json!("r,s")),
            "a: {x: 1, w: 'r,s'}\n",
        ),
        (
            "a: {x: 1, w: z}\n",
            set("a.w", json!("r,s")),
            "a: {x: 1, w: \"r,s\"}\n",
        ),
        (
            "a: {x: 1, w: 2}\n",
            LeafEdit::Remove(p("a.w")),
            "a: {x: 1}\n",
        ),
        (
            "a: {x: 1, w: 2}\n",
            LeafEdit::Remove(p("a.x")),
            "a: {w: 2}\n",
        ),
        (
            "a: [1, 2] # c\n",
            set("a", json!([3, "on"])),
            "a: [3, \"on\"] # c\n",
        ),
        ("a: {b: {}}\n", set("a.b.c", json!(1)), "a: {b: {c: 1}}\n"),
        (
            "a:\n  - x\nb: 1\n",
            set("c", json!(["v"])),
            "a:\n  - x\nb: 1\nc:\n  - v\n",
        ),
    ];
    for (text, e, want) in cases {
        let out = edit(text, std::slice::from_ref(&e)).unwrap();
        assert!(out.faithful, "{text}");
        assert_eq!(out.text, want, "{text}");
    }
}

#[test]
fn parse_follows_go_yaml_v2() {
    let v = parse("a: on\nb: 0644\nc: 0x1F\nd: 1_000\ne: 1e3\nf: y\ng: ~\nh: '1'\ni: 10.96.0.10\nj: -5\nk: 18446744073709551615\non: 1\n").unwrap();
    assert_eq!(
        v,
        json!({"a": true, "b": 420, "c": 31, "d": 1000, "e": 1000.0, "f": true, "g": null,
               "h": "1", "i": "10.96.0.10", "j": -5, "k": 18446744073709551615u64, "true": 1})
    );
    assert!(matches!(
        parse("a: 1\n---\nb: 2\n"),
        Err(ConfigError::MultipleDocuments { count: 2 })
    ));
    assert!(matches!(parse(""), Err(ConfigError::Empty)));
    assert!(matches!(
        parse("- a\n"),
        Err(ConfigError::TopLevelNotMapping { .. })
    ));
    assert!(matches!(
        parse("a: 1\na: 2\n"),
        Err(ConfigError::DuplicateKey { .. })
    ));
    assert!(matches!(parse("a: [\n"), Err(ConfigError::Syntax { .. })));
    assert!(matches!(
        parse("a: .inf\n"),
        Err(ConfigError::Unsupported { .. })
    ));
    assert!(matches!(
        parse("a: &x {b: 1}\n<<: *x\n"),
        Err(ConfigError::Unsupported { .. })
    ));
    let deep = format!("a: {}{}\n", "[".repeat(500), "]".repeat(500));
    assert!(parse(&deep).is_err());
}

#[test]
fn leaves_and_get() {
    let partial = json!({"maxPods": 250, "systemReserved": {"cpu": "500m", "memory": "1Gi"},
                         "crashLoopBackOff": {}, "clusterDNS": ["a"], "x": null});
    let l = leaves(&partial);
    assert_eq!(
        l,
        vec![
            (p("maxPods"), json!(250)),
            (p("systemReserved.cpu"), json!("500m")),
            (p("systemReserved.memory"), json!("1Gi")),
            (p("crashLoopBackOff"), json!({})),
            (p("clusterDNS"), json!(["a"])),
            (p("x"), Value::Null),
        ]
    );
    assert!(leaves(&json!({})).is_empty());
    assert_eq!(leaves(&json!(1)), vec![(vec![], json!(1))]);
    assert_eq!(
        get(&partial, &p("systemReserved.cpu")),
        Some(&json!("500m"))
    );
    assert_eq!(get(&partial, &p("maxPods.x")), None);
    // Merging a whole partial through leaves.
    let text = FIXTURES[3].1;
    let edits: Vec<LeafEdit> = l.into_iter().map(|(p, v)| LeafEdit::Set(p, v)).collect();
    let out = edit(text, &edits).unwrap();
    assert!(out.faithful);
    assert_eq!(parse(&out.text).unwrap(), expected_after(text, &edits));
}

// ---------------- property tests ----------------

fn path_strategy() -> impl Strategy<Value = FieldPath> {
    let mut pool: Vec<FieldPath> = Vec::new();
    for (_, text) in FIXTURES {
        for (path, _) in leaves(&parse(text).unwrap()) {
            if !pool.contains(&path) {
                for i in 1..=path.len() {
                    let pre = path[..i].to_vec();
                    if !pool.contains(&pre) {
                        pool.push(pre);
                    }
                }
            }
        }
    }
    for extra in [
        "maxPods",
        "systemReserved.cpu",
        "systemReserved.memory",
        "kubeReserved.ephemeral-storage",
        "crashLoopBackOff.maxContainerRestartPeriod",
        "evictionHard.memory.available",
        "featureGates.on",
        "a.b.c",
        "zzz",
        "AAA",
        "logging.options.json.infoBufferSize",
        "clusterDNS.x",
        "cgroupDriver.y",
    ] {
        pool.push(p(extra));
    }
    proptest::sample::select(pool)
}

fn scalar_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        proptest::sample::select(vec![
            "on",
            "no",
            "yes",
            "0",
            "1.5",
            "0644",
            "1e3",
            "",
            "~",
            "null",
            "500m",
            "2m0s",
            "a: b",
            " x",
            "#x",
            "x #y",
            "'q'",
            "\"dq\"",
            "-",
            "10.96.0.10",
            "a\nb",
            "\u{85}",
        ])
        .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ]
}

fn value_strategy() -> impl Strategy<Value = Value> {
    scalar_strategy().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::vec(("[a-z]{1,6}|on|y|0", inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn edit_strategy() -> impl Strategy<Value = LeafEdit> {
    prop_oneof![
        (path_strategy(), value_strategy()).prop_map(|(p, v)| LeafEdit::Set(p, v)),
        path_strategy().prop_map(LeafEdit::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn f_edits_satisfy_semantics(
        fixture in 0..FIXTURES.len(),
        edits in proptest::collection::vec(edit_strategy(), 1..6),
    ) {
        let text = FIXTURES[fixture].1;
        let mut want = parse(text).unwrap();
        let mut want_err = false;
        for e in &edits {
            if apply(&mut want, e).is_err() {
                want_err = true;
                break;
            }
        }
        match edit(text, &edits) {
            Ok(out) => {
                prop_assert!(!want_err);
                prop_assert_eq!(parse(&out.text).unwrap(), want);
                prop_assert!(out.faithful, "fell back on {:?}:\n{}", edits, out.text);
            }
            Err(e) => {
                prop_assert!(want_err, "unexpected error {}", e);
                prop_assert!(matches!(e, ConfigError::ParentNotMapping { .. }), "wrong error kind: {}", e);
            }
        }
    }

    #[test]
    fn f_semantics_on_tricky_docs(
        doc in 0..4usize,
        edits in proptest::collection::vec(edit_strategy(), 1..5),
    ) {
        let text = [
            "# head\n---\nmaxPods: 1 # c\n\"systemReserved\":\n    cpu: '1'\n    # note\nclusterDNS:\n  - a\n  - b\nzzz: x\n...\n",
            "a: &x 1\nb: *x\nlogging: {format: text}\ncrashLoopBackOff: {}\nfeatureGates:\n  on: true",
            "kind: KubeletConfiguration\r\nsystemReserved:\r\n  memory: 1Gi\r\nauthentication:\r\n  webhook:\r\n    cacheTTL: 0s\r\n",
            "a:\nb: |\n  lit\nc: plain\n  continued\nd: \"x\n  y\"\n",
        ][doc];
        let mut want = parse(text).unwrap();
        let want_err = edits.iter().any(|e| apply(&mut want, e).is_err());
        match edit(text, &edits) {
            Ok(out) => {
                prop_assert!(!want_err);
                prop_assert_eq!(parse(&out.text).unwrap(), want);
            }
            Err(e) => prop_assert!(want_err, "unexpected error {}", e),
        }
    }

    /// A [`Document`] answers as [`parse`], [`raw_scalars`] and [`edit`] answer on its
    /// text: the fixtures, with and without a byte-order mark, and YAML-like noise.
    #[test]
    fn h_document_answers_as_the_functions(
        fixture in 0..FIXTURES.len(),
        bom in any::<bool>(),
        noise in "([a-c]|: |:|-|- |\n|  |#|\\{|\\}|\\[|\\]|&a|\\*a|'|\"|,|---)*",
        use_noise in any::<bool>(),
        edits in proptest::collection::vec(edit_strategy(), 0..5),
    ) {
        let body = if use_noise { noise } else { FIXTURES[fixture].1.to_string() };
        let text = if bom { format!("\u{feff}{body}") } else { body };
        let doc = Document::parse(text.clone());
        prop_assert_eq!(doc.text(), text.as_str());
        let err = |e: &ConfigError| e.to_string();
        let want = parse(&text);
        prop_assert_eq!(doc.value().map_err(err), want.as_ref().map_err(err));
        let paths: Vec<FieldPath> = edits.iter().map(|e| e.path().to_vec()).collect();
        prop_assert_eq!(
            doc.raw_scalars(paths.iter().map(|p| &p[..])),
            raw_scalars(&text, paths.iter().map(|p| &p[..]))
        );
        prop_assert_eq!(
            doc.edit(&edits).map_err(|e| e.to_string()),
            edit(&text, &edits).map_err(|e| e.to_string())
        );
    }

    #[test]
    fn g_no_panic_on_arbitrary_text(text in any::<String>(), path in path_strategy()) {
        let _ = parse(&text);
        let _ = edit(&text, &[LeafEdit::Set(path.clone(), json!("x")), LeafEdit::Remove(path)]);
    }

    #[test]
    fn g_no_panic_on_yaml_like_text(
        text in "([a-c]|: |:|-|- |\n|  |#|\\{|\\}|\\[|\\]|&a|\\*a|!|\\||>|'|\"|,|---|\\.\\.\\.|\t|\\?)*",
        path in path_strategy(),
    ) {
        if let Ok(out) = edit(&text, &[LeafEdit::Set(path.clone(), json!({"k": [1]})), LeafEdit::Remove(vec!["a".into()])]) {
            let mut want = parse(&text).unwrap();
            let _ = apply(&mut want, &LeafEdit::Set(path, json!({"k": [1]})));
            let _ = apply(&mut want, &LeafEdit::Remove(vec!["a".into()]));
            prop_assert_eq!(parse(&out.text).unwrap(), want);
        }
    }
}

/// A file that starts with a UTF-8 byte-order mark is edited as the same file without
/// it (an insertion, a replacement, a removal, a raw scalar), and keeps its BOM.
#[test]
fn a_byte_order_mark_is_kept_and_does_not_block_an_edit() {
    let plain = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\nclusterDomain: cluster.local\n";
    let bom = format!("\u{feff}{plain}");
    let p = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
    let cases = [
        vec![LeafEdit::Set(p("serializeImagePulls"), Value::Bool(false))],
        vec![LeafEdit::Set(p("maxPods"), Value::from(250))],
        vec![LeafEdit::Remove(p("clusterDomain"))],
        vec![
            LeafEdit::Set(p("systemReserved.cpu"), Value::from("500m")),
            LeafEdit::Set(p("maxPods"), Value::from(250)),
        ],
    ];
    for edits in cases {
        let want = edit(plain, &edits).unwrap();
        let got = edit(&bom, &edits).unwrap();
        assert!(want.faithful, "{edits:?}");
        assert!(got.faithful, "{edits:?}: {:?}", got.text);
        assert_eq!(got.text, format!("\u{feff}{}", want.text), "{edits:?}");
    }
    assert_eq!(
        raw_scalar(&bom, &p("clusterDomain")).as_deref(),
        Some("cluster.local")
    );
    assert_eq!(parse(&bom).unwrap(), parse(plain).unwrap());
}
