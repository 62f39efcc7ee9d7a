//! Secrets out before anything else reads a bootstrap object.

use serde_json::Value;

/// Removes bootstrap secrets from a KubeadmConfig(-Template) object in place:
/// `joinConfiguration.discovery` (bootstrap token, CA hashes, kubeconfig) and
/// `initConfiguration.bootstrapTokens`, under `spec` or `spec.template.spec`. Called on
/// every request before anything reads, logs or forwards the object.
pub fn redact(obj: &mut Value) {
    for root in ["/spec", "/spec/template/spec"] {
        let Some(spec) = obj.pointer_mut(root) else {
            continue;
        };
        if let Some(j) = spec
            .get_mut("joinConfiguration")
            .and_then(Value::as_object_mut)
        {
            j.remove("discovery");
        }
        if let Some(i) = spec
            .get_mut("initConfiguration")
            .and_then(Value::as_object_mut)
        {
            i.remove("bootstrapTokens");
        }
    }
}
