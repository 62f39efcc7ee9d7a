//! The pure CAPI answers (translation, decision, patches) on the fixture requests, with
//! node coverage stubbed: every node change covered unless a test says otherwise. The
//! black-box tests in `capi.rs` run the same scenarios through real agents.

use std::path::PathBuf;

use inplace_extension::capi;
use inplace_extension::capi::types::{CanUpdateMachineRequest, CanUpdateMachineSetRequest, Patch};
use inplace_extension::capi::{Capability, NodeCoverage, PreserveMode, patch};
use serde_json::{Value, json};

fn fixture(rel: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/capi")
        .join(rel);
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn ops(p: &Option<Patch>) -> Value {
    p.as_ref()
        .map(|p| p.operations().unwrap())
        .unwrap_or(json!([]))
}

fn expected_ops(resp: &Value, key: &str) -> Value {
    let p: Patch = serde_json::from_value(resp[key].clone()).unwrap();
    p.operations().unwrap()
}

/// Every node change covered, bare metal (the node recommends preservation).
fn all_covered() -> NodeCoverage {
    NodeCoverage {
        preserve: true,
        preserve_reasons: vec!["bare metal".into()],
        ..Default::default()
    }
}

fn machine(
    dir: &str,
    cov: &NodeCoverage,
    mode: PreserveMode,
) -> (
    CanUpdateMachineRequest,
    inplace_extension::capi::types::CanUpdateMachineResponse,
) {
    let mut req: CanUpdateMachineRequest =
        serde_json::from_value(fixture(&format!("{dir}/canupdatemachine-request.json"))).unwrap();
    req.redact();
    let resp = capi::can_update_machine(
        &req.current,
        &req.desired,
        capi::machine_diff(&req.current, &req.desired),
        Some(cov),
        mode,
    );
    (req, resp)
}

/// Applies `ops` to current and returns the top-level spec fields still different from desired.
fn remaining(cur: &Value, des: &Value, ops: &Value, root: &str) -> Vec<String> {
    let out = patch::apply(cur, ops.as_array().unwrap()).unwrap();
    let (a, b) = (out.pointer(root).unwrap(), des.pointer(root).unwrap());
    let keys: std::collections::BTreeSet<&String> = a
        .as_object()
        .unwrap()
        .keys()
        .chain(b.as_object().unwrap().keys())
        .collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

#[test]
fn scenario_a_replaces_both_lists() {
    let (req, resp) = machine(
        "a-kubelet-args-and-sysctl",
        &all_covered(),
        PreserveMode::Auto,
    );
    let want = fixture("a-kubelet-args-and-sysctl/canupdatemachine-response.json");
    assert_eq!(
        ops(&resp.bootstrap_config_patch),
        expected_ops(&want, "bootstrapConfigPatch")
    );
    assert!(resp.machine_patch.is_none() && resp.infrastructure_machine_patch.is_none());
    assert_eq!(resp.preserve_on_insufficient_coverage, None);
    let (c, d) = (
        req.current.bootstrap_config.unwrap(),
        req.desired.bootstrap_config.unwrap(),
    );
    assert!(remaining(&c, &d, &ops(&resp.bootstrap_config_patch), "/spec").is_empty());
}

#[test]
fn scenario_b_covers_ntp_only_and_preserves_on_bare_metal() {
    let (req, resp) = machine(
        "b-disksetup-not-coverable",
        &all_covered(),
        PreserveMode::Auto,
    );
    let want = fixture("b-disksetup-not-coverable/canupdatemachine-response.json");
    assert_eq!(
        ops(&resp.bootstrap_config_patch),
        expected_ops(&want, "bootstrapConfigPatch")
    );
    assert_eq!(resp.preserve_on_insufficient_coverage, Some(true));
    assert!(resp.message.contains("spec.diskSetup"), "{}", resp.message);
    let (c, d) = (
        req.current.bootstrap_config.unwrap(),
        req.desired.bootstrap_config.unwrap(),
    );
    assert_eq!(
        remaining(&c, &d, &ops(&resp.bootstrap_config_patch), "/spec"),
        vec!["diskSetup"]
    );
    // A virtual machine: the node does not recommend preservation.
    let vm = NodeCoverage::default();
    let (_, resp) = machine("b-disksetup-not-coverable", &vm, PreserveMode::Auto);
    assert_eq!(resp.preserve_on_insufficient_coverage, None);
    let (_, resp) = machine("b-disksetup-not-coverable", &vm, PreserveMode::Always);
    assert_eq!(resp.preserve_on_insufficient_coverage, Some(true));
    let (_, resp) = machine(
        "b-disksetup-not-coverable",
        &all_covered(),
        PreserveMode::Never,
    );
    assert_eq!(resp.preserve_on_insufficient_coverage, None);
}

/// Scenario c: a v1beta1 KubeadmConfig, which CAPI never sends, is not read: no patch,
/// and the message names the apiVersion and the version CAPI sends.
#[test]
fn scenario_c_v1beta1_is_not_covered_naming_the_api_version() {
    let (_, resp) = machine(
        "c-v1beta1-kubeletextraargs-map",
        &all_covered(),
        PreserveMode::Never,
    );
    assert!(resp.bootstrap_config_patch.is_none(), "{resp:?}");
    assert!(
        resp.message.contains("not covered: bootstrapConfig.apiVersion (KubeadmConfig apiVersion \"bootstrap.cluster.x-k8s.io/v1beta1\" is not read: CAPI sends KubeadmConfigs and KubeadmConfigTemplates at bootstrap.cluster.x-k8s.io/v1beta2"),
        "{}",
        resp.message
    );
}

#[test]
fn scenario_d_gzip_file_patch_is_equivalent() {
    let (req, resp) = machine("d-gzip-file-etcd-owner", &all_covered(), PreserveMode::Auto);
    let want = fixture("d-gzip-file-etcd-owner/canupdatemachine-response.json");
    let (c, d) = (
        req.current.bootstrap_config.unwrap(),
        req.desired.bootstrap_config.unwrap(),
    );
    // The fixture addresses files[1] by index; we replace the atomic list (as in a and e).
    // Both must leave nothing different, and the content string is copied verbatim.
    let ours = patch::apply(&c, ops(&resp.bootstrap_config_patch).as_array().unwrap()).unwrap();
    let theirs = patch::apply(
        &c,
        expected_ops(&want, "bootstrapConfigPatch")
            .as_array()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ours["spec"], theirs["spec"]);
    assert_eq!(ours["spec"], d["spec"]);
}

#[test]
fn uncovered_node_change_leaves_its_unit_different() {
    let mut cov = all_covered();
    cov.changes
        .insert("kubelet.flags[max-pods]".into(), Err("overridden".into()));
    let (req, resp) = machine("a-kubelet-args-and-sysctl", &cov, PreserveMode::Auto);
    let (c, d) = (
        req.current.bootstrap_config.unwrap(),
        req.desired.bootstrap_config.unwrap(),
    );
    assert_eq!(
        remaining(&c, &d, &ops(&resp.bootstrap_config_patch), "/spec"),
        vec!["joinConfiguration"]
    );
    assert_eq!(resp.preserve_on_insufficient_coverage, Some(true));
    assert!(
        resp.message.contains("kubelet.flags[max-pods]: overridden"),
        "{}",
        resp.message
    );
}

#[test]
fn scenario_e_machineset_template_patch() {
    let req: CanUpdateMachineSetRequest = serde_json::from_value(fixture(
        "e-machineset-worker-template/canupdatemachineset-request.json",
    ))
    .unwrap();
    let want = fixture("e-machineset-worker-template/canupdatemachineset-response.json");
    let caps = [
        Capability::Files,
        Capability::KubeletExtraArgs,
        Capability::Ntp,
    ];
    let kinds = vec!["Metal3MachineTemplate".to_string()];
    let resp = capi::can_update_machine_set(
        &req.current,
        &req.desired,
        &caps,
        PreserveMode::Auto,
        &kinds,
    );
    assert_eq!(
        ops(&resp.bootstrap_config_template_patch),
        expected_ops(&want, "bootstrapConfigTemplatePatch")
    );
    assert!(resp.machine_set_patch.is_none());
    assert_eq!(resp.preserve_on_insufficient_coverage, None);
    // reserved-cpus under the static CPU manager: the agents drain and reset the kubelet.
    assert!(
        resp.message
            .contains("node disruption: drain, kubelet stopped"),
        "{}",
        resp.message
    );
    // Deterministic: the same request gives a byte-identical answer.
    let again = capi::can_update_machine_set(
        &req.current,
        &req.desired,
        &caps,
        PreserveMode::Auto,
        &kinds,
    );
    assert_eq!(
        serde_json::to_vec(&resp).unwrap(),
        serde_json::to_vec(&again).unwrap()
    );
    // Without the kubelet capability: args stay different and the Metal3 kind preserves.
    let resp = capi::can_update_machine_set(
        &req.current,
        &req.desired,
        &caps[..1],
        PreserveMode::Auto,
        &kinds,
    );
    assert_eq!(resp.preserve_on_insufficient_coverage, Some(true));
    assert!(
        resp.message.contains("kubeletExtraArgs"),
        "{}",
        resp.message
    );
}

mod property {
    use super::*;
    use inplace_extension::capi::types::MachineObjects;
    use proptest::prelude::*;

    fn kubeadm_spec() -> impl Strategy<Value = Value> {
        let files = prop::collection::btree_map(
            prop::sample::select(vec!["/etc/a", "/etc/b", "/etc/c"]),
            prop::sample::select(vec!["x", "y", "{{ ds.x }}"]),
            0..3,
        );
        let args = prop::collection::btree_map(
            prop::sample::select(vec!["max-pods", "v", "node-labels"]),
            prop::sample::select(vec!["1", "2"]),
            0..3,
        );
        let ntp = prop::option::of(prop::collection::vec(
            prop::sample::select(vec!["n1", "n2"]),
            0..2,
        ));
        let disk = prop::option::of(prop::sample::select(vec!["sdb", "sdc"]));
        let users = prop::option::of(prop::sample::select(vec!["ops", "dev"]));
        (files, args, ntp, disk, users).prop_map(|(files, args, ntp, disk, users)| {
            let mut spec = json!({
                "files": files.iter().map(|(p, c)| json!({"path": p, "content": c})).collect::<Vec<_>>(),
                "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs":
                    args.iter().map(|(n, v)| json!({"name": n, "value": v})).collect::<Vec<_>>()}},
            });
            if let Some(s) = ntp { spec["ntp"] = json!({"servers": s, "enabled": true}); }
            if let Some(d) = disk { spec["diskSetup"] = json!({"partitions": [{"device": d}]}); }
            if let Some(u) = users { spec["users"] = json!([{"name": u}]); }
            json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig", "spec": spec})
        })
    }

    fn objects(bc: Value) -> MachineObjects {
        MachineObjects {
            machine: json!({"spec": {"version": "v1.34.2"}}),
            infrastructure_machine: json!({"kind": "Metal3Machine", "spec": {}}),
            bootstrap_config: Some(bc),
        }
    }

    proptest! {
        /// For random current/desired KubeadmConfigs and random node coverage, applying the
        /// bootstrap patch to current leaves exactly the uncovered units different from
        /// desired, and touches nothing outside the units.
        #[test]
        fn patch_leaves_exactly_the_uncovered_units(cur in kubeadm_spec(), des in kubeadm_spec(), refuse in prop::collection::vec(any::<bool>(), 8)) {
            let (c, d) = (objects(cur.clone()), objects(des.clone()));
            let analysis = capi::machine_diff(&c, &d);
            let mut cov = NodeCoverage::default();
            let ids: Vec<String> = analysis.units.iter().flat_map(|u| u.ids.clone()).collect();
            for (i, id) in ids.iter().enumerate() {
                let v = if refuse[i % refuse.len()] { Err("no".to_string()) } else { Ok(()) };
                cov.changes.insert(id.clone(), v);
            }
            let decision = capi::decide(analysis.units.clone(), &cov);
            let resp = capi::can_update_machine(&c, &d, analysis.clone(), Some(&cov), PreserveMode::Never);
            let out = patch::apply(&cur, ops(&resp.bootstrap_config_patch).as_array().unwrap()).unwrap();
            for u in &decision.covered {
                prop_assert_eq!(patch::get(&out, &u.unit.tokens), patch::get(&des, &u.unit.tokens), "covered {}", u.path);
            }
            for (path, _) in &decision.uncovered {
                let u = analysis.units.iter().find(|u| &u.path == path).unwrap();
                prop_assert_ne!(patch::get(&out, &u.unit.tokens), patch::get(&des, &u.unit.tokens), "uncovered {}", path);
                prop_assert_eq!(patch::get(&out, &u.unit.tokens), patch::get(&cur, &u.unit.tokens));
            }
            prop_assert_eq!(out["spec"] == des["spec"], decision.uncovered.is_empty());
        }
    }
}

/// Scenario f: what UpdateMachine sends the agent (the desired NodeSpec of the redacted
/// request) holds neither the bootstrap token nor its secret half; the redacted request
/// itself no longer holds it either.
#[test]
fn scenario_f_token_is_not_in_the_agent_request() {
    use inplace_extension::capi::types::UpdateMachineRequest;
    use prost::Message;
    let mut req: UpdateMachineRequest = serde_json::from_value(fixture(
        "f-updatemachine-bootstrap-token/updatemachine-request.json",
    ))
    .unwrap();
    assert!(
        serde_json::to_string(&req)
            .unwrap()
            .contains("b7bn3izenrsfazb2")
    );
    req.redact();
    assert!(
        !serde_json::to_string(&req)
            .unwrap()
            .contains("b7bn3izenrsfazb2")
    );
    let spec = capi::desired_node_spec(&req.desired);
    assert!(
        !spec.files.is_empty() && spec.kubelet.is_some(),
        "the spec carries the update: {spec:?}"
    );
    let wire = spec.encode_to_vec();
    assert!(!wire.windows(16).any(|w| w == b"b7bn3izenrsfazb2"));
    assert!(!format!("{spec:?}").contains("b7bn3izenrsfazb2"));
}
