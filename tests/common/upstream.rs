//! Cluster API's own decision on a CanUpdate answer, emulated: upstream
//! `internal/util/patch/patch.go` applies each defined patch (RFC 6902, here the
//! `json-patch` crate) to the whole *current* object, copies back only `spec` (Machine,
//! InfraMachine, BootstrapConfig) or `spec.template.spec` (MachineSet and templates), and
//! compares with desired exactly (go-cmp, lists atomic). Machine specs are compared after
//! `CleanupMachineSpecForDiff` clears `clusterName`, `bootstrap`, `infrastructureRef`,
//! `providerID`, `minReadySeconds`, `readinessGates`, the `deletion` timeouts and `taints`.

use inplace_extension::capi::types::Patch;
use serde_json::Value;

/// The objects of a request side that CAPI compares, with the patch key that targets
/// each and where its spec lives.
fn objects(hook: &str) -> &'static [(&'static str, &'static str, &'static str)] {
    match hook {
        "CanUpdateMachineSet" => &[
            ("machineSet", "machineSetPatch", "/spec/template/spec"),
            (
                "infrastructureMachineTemplate",
                "infrastructureMachineTemplatePatch",
                "/spec/template/spec",
            ),
            (
                "bootstrapConfigTemplate",
                "bootstrapConfigTemplatePatch",
                "/spec/template/spec",
            ),
        ],
        _ => &[
            ("machine", "machinePatch", "/spec"),
            (
                "infrastructureMachine",
                "infrastructureMachinePatch",
                "/spec",
            ),
            ("bootstrapConfig", "bootstrapConfigPatch", "/spec"),
        ],
    }
}

fn cleanup_machine_spec(spec: &mut Value) {
    if let Some(o) = spec.as_object_mut() {
        for k in [
            "clusterName",
            "bootstrap",
            "infrastructureRef",
            "providerID",
            "minReadySeconds",
            "readinessGates",
            "taints",
        ] {
            o.remove(k);
        }
        if let Some(d) = o.get_mut("deletion").and_then(Value::as_object_mut) {
            d.retain(|k, _| !k.ends_with("TimeoutSeconds"));
            if d.is_empty() {
                o.remove("deletion");
            }
        }
    }
}

/// The dotted objects that still differ after CAPI applies `resp` to `req`'s current
/// objects; empty = CAPI sees the Machine (or MachineSet) fully covered.
pub(crate) fn still_different(hook: &str, req: &Value, resp: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (obj, key, at) in objects(hook) {
        let (Some(cur), Some(des)) = (req["current"].get(*obj), req["desired"].get(*obj)) else {
            continue;
        };
        let mut patched = cur.clone();
        if let Some(p) = resp.get(*key) {
            let p: Patch = serde_json::from_value(p.clone()).expect("a patch CAPI can read");
            let ops: json_patch::Patch =
                serde_json::from_value(p.operations().expect("decodable")).expect("RFC 6902");
            json_patch::patch(&mut patched, &ops).expect("the patch applies to current");
        }
        let mut ours = patched.pointer(at).cloned().unwrap_or(Value::Null);
        let mut want = des.pointer(at).cloned().unwrap_or(Value::Null);
        // a MachineSet template spec is a Machine spec, cleaned the same way
        if *obj == "machine" || *obj == "machineSet" {
            cleanup_machine_spec(&mut ours);
            cleanup_machine_spec(&mut want);
        }
        if ours != want {
            out.push(obj.to_string());
        }
    }
    out
}

/// Asserts that an answer says what CAPI will conclude from it: a `Success` answer that
/// names nothing uncovered leaves nothing different, one that names something uncovered
/// (or asks for preservation) leaves a difference.
pub(crate) fn check(hook: &str, req: &Value, resp: &Value) {
    if resp["status"] != "Success" {
        return;
    }
    let left = still_different(hook, req, resp);
    let msg = resp["message"].as_str().unwrap_or("");
    let claims_uncovered = msg.contains("not covered: ");
    assert_eq!(
        claims_uncovered,
        !left.is_empty(),
        "{hook}: the answer says {msg:?} but CAPI would see {left:?} still different"
    );
    if resp.get("preserveOnInsufficientCoverage") == Some(&Value::Bool(true)) {
        assert!(
            !left.is_empty(),
            "{hook}: preservation asked for a fully covered Machine"
        );
    }
}
