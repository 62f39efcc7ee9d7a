//! `inplacectl validate -f FILE`: checks a NodeSpec offline, with no agent, by the rules
//! the agent applies to every request before it looks at the node: the YAML file form
//! ([`inplace_wire::yaml::parse`]) and each section's validation with the drop-ins merged
//! ([`crate::sections::model::NodeSpec::from_pb`]), so the messages are the agent's
//! (`<field>: <what is wrong and the fix>`). It also refuses what no node would cover
//! whatever its state: a `kubelet.config` field the KubeletConfiguration
//! (kubelet.config.k8s.io/v1beta1) does not have, with coverage's words and exit code 3.
//! What only the node can tell (the rest of coverage, the node's `policy.denied_paths`,
//! the boot loader, whether a path is another package's) is `inplacectl coverage`'s.

use std::path::Path;
use std::process::ExitCode;

use inplace_wire::names::SpecError;

use crate::sections::model::NodeSpec;

/// The outcome for one file: the spec's hash when valid, the first error otherwise.
pub(crate) fn check(text: &str) -> Result<String, SpecError> {
    let wire = inplace_wire::yaml::parse(text)?;
    Ok(NodeSpec::from_pb(&wire)?.hash())
}

/// What no node covers, whatever its state: each `kubelet.config` field that is not a
/// top-level KubeletConfiguration field, as (`kubelet.config.<field>`, coverage's reason),
/// in the spec's order (drop-ins merged). Empty for a spec that does not parse.
pub(crate) fn never_covered(text: &str) -> Vec<(String, String)> {
    let Ok(spec) = inplace_wire::yaml::parse(text)
        .map_err(|_| ())
        .and_then(|w| NodeSpec::from_pb(&w).map_err(|_| ()))
    else {
        return Vec::new();
    };
    spec.kubelet
        .config
        .iter()
        .flat_map(|c| c.keys())
        .filter(|k| !inplace_formats::kubelet::fields::is_known(k))
        .map(|k| {
            (
                format!("kubelet.config.{k}"),
                inplace_formats::kubelet::fields::unknown_field_message(k),
            )
        })
        .collect()
}

/// Runs `validate`: exit 0 and `<file>: valid (<hash>)` for a valid spec; exit 2 and the
/// error (`invalid spec <file>: <field>: <message>` on standard error, or a JSON object
/// `{"file", "valid", "field", "message"}` on standard output with `-o json`) otherwise;
/// exit 1 when the file can not be read.
pub(crate) fn run(file: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| anyhow::anyhow!("reading the spec from standard input: {e}"))?
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?
    };
    let name = file.display().to_string();
    let outcome = check(&text);
    let never = never_covered(&text);
    if let (Ok(_), Some((field, message))) = (&outcome, never.first()) {
        // valid, but refused by every agent's coverage: exit 3, as `coverage` would
        if json {
            let v = serde_json::json!({"file": name, "valid": true, "covered": false, "field": field, "message": message});
            super::ctl::emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
        } else {
            eprintln!("not coverable {name}: {field}: {message}");
        }
        return Ok(ExitCode::from(3));
    }
    if json {
        let v = match &outcome {
            Ok(hash) => serde_json::json!({"file": name, "valid": true, "specHash": hash}),
            Err(e) => {
                serde_json::json!({"file": name, "valid": false, "field": e.field, "message": e.message})
            }
        };
        super::ctl::emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
        return Ok(ExitCode::from(if outcome.is_ok() { 0 } else { 2 }));
    }
    match outcome {
        Ok(hash) => {
            super::ctl::emit(&format!("{name}: valid ({hash})\n"));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("invalid spec {name}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn the_agents_rules_and_messages() {
        assert!(check("kubelet:\n  flags:\n    max-pods: \"250\"\n").is_ok());
        let e = check("files:\n- path: etc/x\n  content: a\n").unwrap_err();
        assert_eq!(e.field, "files[0].path");
        let e = check("filez: []\n").unwrap_err();
        assert_eq!(e.field, "spec");
        let e = check("kernelArgs: [console=ttyS1,115200n8]\n").unwrap_err();
        assert_eq!(e.field, "kernelArgs[1]");
    }

    #[test]
    fn a_misspelt_kubelet_field_is_never_covered() {
        let spec = "kubelet:\n  config:\n    maxPods: 250\n    systemreserved:\n      cpu: 500m\n";
        assert!(check(spec).is_ok());
        let n = super::never_covered(spec);
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(n[0].0, "kubelet.config.systemreserved");
        assert!(
            n[0].1
                .starts_with("systemreserved is not a KubeletConfiguration")
        );
        assert!(
            super::never_covered("kubelet:\n  config:\n    systemReserved:\n      cpu: 500m\n")
                .is_empty()
        );
    }
}
