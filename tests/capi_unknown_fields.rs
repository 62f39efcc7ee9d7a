//! Unknown members of the CAPI types, black box: a member the translation does not read, at any depth and on
//! either side of a changed entry, makes its unit not covered with the member's JSON
//! pointer; an entry identical on both sides needs no node action. Every answer goes
//! through the real extension over HTTPS to a real agent on a fixture copy, and CAPI's
//! own apply-and-compare (`tests/common/upstream.rs`) runs on each.

mod common;

use common::capi::{Extension, Pki, fixture, one_agent};
use inplace_extension::capi::types::Patch;
use serde_json::{Value, json};

const ARGS: &str = "/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs";

/// Where an unknown member goes: the tokens below `spec` of the entry (or object).
#[derive(Clone, Copy)]
enum Side {
    Desired,
    Current,
    Both,
}

fn with_unknown(req: &Value, at: &str, side: Side, value: Value) -> Value {
    with_unknown_in(req, "bootstrapConfig", at, side, value)
}

/// [`with_unknown`] in the request's object `object` (`bootstrapConfigTemplate`).
fn with_unknown_in(req: &Value, object: &str, at: &str, side: Side, value: Value) -> Value {
    let mut r = req.clone();
    let (parent, key) = at.rsplit_once('/').unwrap();
    let mut put = |which: &str| {
        let obj = r[which][object]
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{which}: no {parent}"));
        obj.as_object_mut()
            .unwrap()
            .insert(key.into(), value.clone());
    };
    match side {
        Side::Desired => put("desired"),
        Side::Current => put("current"),
        Side::Both => {
            put("desired");
            put("current");
        }
    }
    r
}

/// The reason the answer gives for `unit` (dotted path), or `None` if it is in place.
fn not_covered<'a>(msg: &'a str, unit: &str) -> Option<&'a str> {
    let rest = msg.split_once("not covered: ")?.1;
    let start = rest.find(&format!("{unit} ("))?;
    Some(&rest[start..])
}

/// The paths the bootstrap config patch writes.
fn patched_paths(resp: &Value) -> Vec<String> {
    let Some(p) = resp.get("bootstrapConfigPatch") else {
        return vec![];
    };
    let p: Patch = serde_json::from_value(p.clone()).unwrap();
    p.operations()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap().to_string())
        .collect()
}

fn in_place(msg: &str) -> Vec<String> {
    msg.split_once("in place: ")
        .map(|(_, r)| r.split(" (node disruption").next().unwrap_or(""))
        .map(|r| r.split("; not covered").next().unwrap_or(""))
        .map(|r| r.split(", ").map(String::from).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_members_at_every_depth_on_either_side_are_never_in_place() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    // Scenario a: files[0] and kubeletExtraArgs[0] change; files[1] and the other
    // arguments are identical on both sides.
    let base = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let baseline = ext.can_update_machine(&base).await;
    let msg = baseline["message"].as_str().unwrap();
    assert_eq!(
        in_place(msg),
        [
            "spec.joinConfiguration.nodeRegistration.kubeletExtraArgs",
            "spec.files"
        ],
        "{msg}"
    );
    assert!(!msg.contains("not covered"), "{msg}");

    let files = "spec.files";
    let args = "spec.joinConfiguration.nodeRegistration.kubeletExtraArgs";
    // (member pointer, the unit it blocks, the unit that stays in place)
    let blocked = [
        ("/spec/files/0/mode", files, args),
        ("/spec/files/1/mode", files, args),
        (&format!("{ARGS}/0/valueFrom") as &str, args, files),
        (&format!("{ARGS}/2/valueFrom"), args, files),
    ];
    for (ptr, unit, other) in blocked {
        for side in [Side::Desired, Side::Current, Side::Both] {
            // files[1] and args[2] are unchanged entries: with the member on both sides
            // they stay identical, which needs no node action (tested below)
            let unchanged = ptr.contains("/files/1/") || ptr.contains("/kubeletExtraArgs/2/");
            if unchanged && matches!(side, Side::Both) {
                continue;
            }
            // a value of any shape: a scalar, or an object one level deeper
            for v in [json!("0755"), json!({"nested": {"deeper": true}})] {
                let req = with_unknown(&base, ptr, side, v.clone());
                let resp = ext.can_update_machine(&req).await;
                let msg = resp["message"].as_str().unwrap();
                let why = not_covered(msg, unit).unwrap_or_else(|| panic!("{ptr} {v}: {msg}"));
                assert!(
                    why.contains(&format!("{ptr} not a field of a v1beta2")),
                    "{ptr}: {msg}"
                );
                assert!(in_place(msg).contains(&other.to_string()), "{ptr}: {msg}");
                assert_eq!(resp["status"], "Success", "{resp}");
                // the blocked unit is not in the patch; the other one is
                let paths = patched_paths(&resp);
                let unit_ptr = format!("/{}", unit.replace('.', "/"));
                assert!(!paths.contains(&unit_ptr), "{ptr}: {paths:?}");
                assert!(
                    paths.contains(&format!("/{}", other.replace('.', "/"))),
                    "{paths:?}"
                );
            }
        }
    }

    // identical on both sides: in place, and the entry is copied with its member
    for ptr in ["/spec/files/1/mode", &format!("{ARGS}/2/valueFrom")] {
        let req = with_unknown(&base, ptr, Side::Both, json!("x"));
        let resp = ext.can_update_machine(&req).await;
        let msg = resp["message"].as_str().unwrap();
        assert_eq!(in_place(msg), [args, files], "{ptr}: {msg}");
        assert!(!msg.contains("not covered"), "{ptr}: {msg}");
    }

    // a member of a struct (ntp), on each side (this node has no time daemon, so only
    // the ntp unit's reason is asserted)
    let mut with_ntp = base.clone();
    for side in ["current", "desired"] {
        with_ntp[side]["bootstrapConfig"]["spec"]["ntp"] =
            json!({"servers": ["ntp1.example.invalid"]});
    }
    for side in [Side::Desired, Side::Current, Side::Both] {
        let req = with_unknown(
            &with_ntp,
            "/spec/ntp/pools",
            side,
            json!(["pool.example.invalid"]),
        );
        let resp = ext.can_update_machine(&req).await;
        let msg = resp["message"].as_str().unwrap();
        let why = not_covered(msg, "spec.ntp");
        let both = matches!(side, Side::Both);
        // identical on both sides, ntp does not differ at all
        assert_eq!(why.is_none(), both, "{msg}");
        if let Some(why) = why {
            assert!(
                why.contains("/spec/ntp/pools not a field of a v1beta2 NTP"),
                "{msg}"
            );
        }
    }

    // object level: a member of the spec itself, or of a handled parent
    for ptr in [
        "/spec/kubeletSettings",
        "/spec/joinConfiguration/nodeRegistration/kubeletFlags",
    ] {
        let req = with_unknown(&base, ptr, Side::Desired, json!({"a": "b"}));
        let resp = ext.can_update_machine(&req).await;
        let msg = resp["message"].as_str().unwrap();
        let unit = ptr.trim_start_matches('/').replace('/', ".");
        assert!(not_covered(msg, &unit).is_some(), "{ptr}: {msg}");
    }
    node.stop();
}

/// The same rule for a MachineSet's KubeadmConfigTemplate (`spec.template.spec`), which
/// CanUpdateMachineSet answers without asking a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_members_in_a_machine_set_template_are_never_in_place() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    // Scenario e: files[0] and kubeletExtraArgs[4] (reserved-cpus) change.
    let base = fixture("e-machineset-worker-template/canupdatemachineset-request.json");
    let files = "spec.template.spec.files";
    let args = "spec.template.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs";
    let cases = [
        ("/spec/template/spec/files/0/mode", files, args),
        (
            "/spec/template/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs/4/valueFrom",
            args,
            files,
        ),
    ];
    for (ptr, unit, other) in cases {
        for side in [Side::Desired, Side::Current, Side::Both] {
            let req = with_unknown_in(&base, "bootstrapConfigTemplate", ptr, side, json!("x"));
            let resp = ext.can_update_machine_set(&req).await;
            let msg = resp["message"].as_str().unwrap();
            let why = not_covered(msg, unit).unwrap_or_else(|| panic!("{ptr}: {msg}"));
            assert!(
                why.contains(&format!("{ptr} not a field of a v1beta2")),
                "{msg}"
            );
            assert!(in_place(msg).contains(&other.to_string()), "{msg}");
        }
    }
}
