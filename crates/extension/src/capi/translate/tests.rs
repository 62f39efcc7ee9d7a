use super::ntp::ntp_of;
use super::*;
use base64::Engine;
use serde_json::json;

#[test]
fn a_gzip_bomb_is_refused_without_inflating_it() {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&vec![0u8; (MAX_DECODED_FILE_BYTES + 1) as usize])
        .unwrap();
    let gz = z.finish().unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&gz);
    let f = json!({"path": "/etc/bomb", "encoding": "gzip+base64", "content": b64});
    let e = decode_file(&f).expect_err("refused");
    assert!(
        e.contains("decompresses to more than 16777216 bytes"),
        "{e}"
    );
    // at the limit it decodes
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(b"x = 1\n").unwrap();
    let ok = json!({"path": "/etc/ok", "encoding": "gzip+base64",
        "content": base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap())});
    assert!(decode_file(&ok).is_ok());
}

#[test]
fn the_files_of_one_config_share_one_decoded_budget() {
    use std::io::Write;
    let bomb = |mib: usize| {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&vec![0u8; mib << 20]).unwrap();
        base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap())
    };
    let file = |i: usize, b64: &str| json!({"path": format!("/etc/b{i}"), "encoding": "gzip+base64", "content": b64});
    let six = bomb(6);
    // 6 + 6 fit, the third does not; nor does anything after it, however small
    let files: Vec<Value> = (0..3)
        .map(|i| file(i, &six))
        .chain([json!({"path": "/etc/small", "content": "x"})])
        .collect();
    let mut budget = DecodeBudget::default();
    let r: Vec<_> = files
        .iter()
        .map(|f| decode_file_within(f, &mut budget))
        .collect();
    assert!(r[0].is_ok() && r[1].is_ok(), "{r:?}");
    for e in &r[2..] {
        assert_eq!(e.as_ref().unwrap_err(), &over_config_budget());
    }
    assert!(budget.exceeded);
    let config = json!({"spec": {"files": files}});
    assert_eq!(
        node_spec_checked(&config, &["spec"]).unwrap_err(),
        over_config_budget()
    );
    assert!(over_config_budget().contains("16777216 bytes in all"));
    // CanUpdate: the unit is blocked naming the limit, unchanged files counting too
    let current = json!({"spec": {"files": [file(0, &six), file(1, &six)]}});
    let a = kubeadm(&current, &config, &["spec"]);
    let files_unit = a.units.iter().find(|u| u.path == "spec.files").unwrap();
    let why = files_unit.blocked.as_deref().unwrap_or_default();
    assert!(
        why.contains("/etc/b2: the files of this bootstrap config"),
        "{why}"
    );
    // two files of 6 MiB decode
    let two = json!({"spec": {"files": [file(0, &six), file(1, &six)]}});
    let (spec, skipped) = node_spec_checked(&two, &["spec"]).unwrap();
    assert_eq!((spec.files.len(), skipped.len()), (2, 0));
}

#[test]
fn only_v1beta2_kubeadm_objects_are_read() {
    let v1 = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig"});
    let e = kubeadm_api_version_problem(&v1).expect("refused");
    assert!(e.contains("\"bootstrap.cluster.x-k8s.io/v1beta1\""), "{e}");
    assert!(e.contains("bootstrap.cluster.x-k8s.io/v1beta2"), "{e}");
    let v2 = json!({"apiVersion": KUBEADM_API_VERSION, "kind": "KubeadmConfigTemplate"});
    assert_eq!(kubeadm_api_version_problem(&v2), None);
    // another provider's kind is not judged here
    let rke2 = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "RKE2Config"});
    assert_eq!(kubeadm_api_version_problem(&rke2), None);
}

#[test]
fn unknown_members_of_changed_entries_block_their_unit() {
    let spec = |files: Value, args: Value, ntp: Value| {
        json!({"spec": {"files": files, "ntp": ntp,
            "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": args}}}})
    };
    let ntp = json!({"servers": ["a"]});
    let c = spec(
        json!([{"path": "/etc/a", "content": "1", "mode": "x"}, {"path": "/etc/b", "content": "1"}]),
        json!([{"name": "max-pods", "value": "110"}]),
        ntp.clone(),
    );
    let d = spec(
        json!([{"path": "/etc/a", "content": "1", "mode": "x"}, {"path": "/etc/b", "content": "2", "sync": true}]),
        json!([{"name": "max-pods", "value": "160", "valueFrom": "x"}]),
        json!({"servers": ["a"], "pools": ["p"]}),
    );
    let a = kubeadm(&c, &d, &["spec"]);
    let reason = |p: &str| {
        a.units
            .iter()
            .find(|u| u.path == p)
            .and_then(|u| u.blocked.clone())
            .unwrap_or_default()
    };
    // /etc/a is identical on both sides: its unknown `mode` needs no node action
    assert!(
        reason("spec.files").starts_with("/etc/b: /spec/files/1/sync not a field"),
        "{a:?}"
    );
    assert!(!reason("spec.files").contains("/etc/a"), "{a:?}");
    assert!(
        reason("spec.joinConfiguration.nodeRegistration.kubeletExtraArgs").starts_with(
            "/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs/0/valueFrom not a field"
        )
    );
    assert!(reason("spec.ntp").starts_with("/spec/ntp/pools not a field"));
    assert!(a.delta.files.is_empty() && a.delta.kubelet.is_none() && a.delta.ntp.is_none());
    // current only: the same
    let a = kubeadm(&d, &c, &["spec"]);
    assert!(a.units.iter().all(|u| u.blocked.is_some()), "{a:?}");
    // UpdateMachine leaves the entries it can not read out, with a note
    let (ns, skipped) = node_spec(&d, &["spec"]);
    assert_eq!(ns.files.len(), 0, "{ns:?}");
    assert!(ns.kubelet.is_none() && ns.ntp.is_none());
    assert_eq!(skipped.len(), 4, "{skipped:?}");
}

#[test]
fn ntp_members_must_have_their_types() {
    assert_eq!(
        ntp_of(Some(&json!({"servers": ["a", 5]}))).unwrap_err(),
        "ntp.servers[1] must be a string"
    );
    assert_eq!(
        ntp_of(Some(&json!({"enabled": "yes", "servers": ["a"]}))).unwrap_err(),
        "ntp.enabled must be a boolean"
    );
}

#[test]
fn kubelet_args_must_be_strings() {
    let v2 = json!([{"name": "max-pods", "value": 250}]);
    assert_eq!(
        kubelet_args_of(Some(&v2)).unwrap_err(),
        "kubeletExtraArgs[0]: name and value must be strings"
    );
    let v1 = json!({"max-pods": "250"});
    assert!(
        kubelet_args_of(Some(&v1))
            .unwrap_err()
            .contains("a map (the v1beta1 shape)")
    );
    // A v1beta2 arg may omit its value (`*string`).
    let flag = json!([{"name": "fail-swap-on"}]);
    assert_eq!(kubelet_args_of(Some(&flag)).unwrap()["fail-swap-on"], "");
}

#[test]
fn redact_drops_discovery_and_tokens() {
    let mut v = json!({"spec": {"joinConfiguration": {"discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef"}}, "nodeRegistration": {}},
        "initConfiguration": {"bootstrapTokens": [{"token": "x"}]}}});
    redact(&mut v);
    assert_eq!(
        v,
        json!({"spec": {"joinConfiguration": {"nodeRegistration": {}}, "initConfiguration": {}}})
    );
}

#[test]
fn removed_arg_and_jinja_change_are_blocked() {
    let c = json!({"spec": {"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [
        {"name": "a", "value": "1"}, {"name": "node-labels", "value": "x={{ ds.meta_data.uuid }}"}]}}}});
    let d = json!({"spec": {"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [
        {"name": "node-labels", "value": "y={{ ds.meta_data.uuid }}"}]}}}});
    let a = kubeadm(&c, &d, &["spec"]);
    let r = a.units[0].blocked.as_deref().unwrap();
    assert!(r.contains("removing kubelet argument a"), "{r}");
    assert!(r.contains("node-labels holds cloud-init Jinja"), "{r}");
    assert!(a.delta.kubelet.is_none());
}

#[test]
fn file_decoding_follows_write_files() {
    let f = json!({"path": "/etc/x", "permissions": "0600", "owner": "etcd:etcd", "encoding": "base64", "content": "aGk="});
    let NodeFile::File(pf) = decode_file(&f).unwrap() else {
        panic!()
    };
    assert_eq!(
        (pf.content.as_slice(), pf.mode, pf.owner.as_str()),
        (&b"hi"[..], Some(0o600), "etcd:etcd")
    );
    let bad = json!({"path": "/etc/x", "permissions": "rw"});
    assert!(
        decode_file(&bad)
            .unwrap_err()
            .contains("permissions \"rw\"")
    );
    let num = json!({"path": "/etc/x", "permissions": 511});
    assert_eq!(
        decode_file(&num).unwrap_err(),
        "permissions must be a string"
    );
    let b64 = json!({"path": "/etc/x", "encoding": "base64", "content": "c2VjcmV0-"});
    assert_eq!(
        decode_file(&b64).unwrap_err(),
        "content is not valid base64"
    );
    let sec = json!({"path": "/etc/x", "contentFrom": {"secret": {"name": "s", "key": "k"}}});
    assert!(decode_file(&sec).unwrap_err().contains("Secret s/k"));
    let d0600 =
        json!({"path": "/etc/inplaced/node.d/10-a.yaml", "permissions": "0600", "content": "{}"});
    assert!(
        decode_file(&d0600)
            .unwrap_err()
            .contains("kept 0644 root:root")
    );
    let d = json!({"path": "/etc/inplaced/node.d/10-a.yaml", "content": "sysctls:\n  vm.x: '1'\n"});
    assert!(
        matches!(decode_file(&d).unwrap(), NodeFile::DropIn(pb::DropIn { ref name, .. }) if name == "10-a.yaml")
    );
}
