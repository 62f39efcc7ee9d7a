//! `inplacectl validate -f`: the real binary, with no agent running, checks a NodeSpec by
//! the agent's rules and gives the agent's message (compared with a running agent's answer
//! to the same file).

mod common;

use std::process::Command;

use common::Node;

fn validate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_inplacectl"))
        .args(["--socket", "/nonexistent/inplaced.sock", "validate"])
        .args(args)
        .output()
        .unwrap()
}

fn write(dir: &std::path::Path, name: &str, yaml: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p.display().to_string()
}

#[test]
fn a_valid_spec_passes_without_an_agent() {
    let dir = common::tempdir();
    let f = write(
        dir.path(),
        "ok.yaml",
        "kubelet:\n  flags:\n    max-pods: \"250\"\nkernelArgs: [\"console=ttyS1,115200n8\"]\n",
    );
    let o = validate(&["-f", &f]);
    assert_eq!(o.status.code(), Some(0), "{}", common::err(&o));
    assert!(
        common::out(&o).starts_with(&format!("{f}: valid (sha256:")),
        "{}",
        common::out(&o)
    );
    let o = validate(&["-f", &f, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert!(v["specHash"].as_str().unwrap().starts_with("sha256:"));
}

#[test]
fn errors_name_the_field_and_the_fix_exit_2() {
    let dir = common::tempdir();
    // maps nested deeper than the agent decodes (it refuses them on the wire)
    let mut deep = String::from("kubelet:\n  config:\n");
    for i in 0..30 {
        deep.push_str(&format!("{}k{i}:\n", "  ".repeat(i + 2)));
    }
    deep.push_str(&format!("{}x: 1\n", "  ".repeat(32)));
    for (yaml, field, fix) in [
        (deep.as_str(), "kubelet.config", "over the limit of 24"),
        (
            "kernelArgs: [console=ttyS1,115200n8]\n",
            "kernelArgs[1]",
            "Quote the argument",
        ),
        ("files:\n- path: etc/x\n  content: a\n", "files[0].path", ""),
        (
            "kernelArgs: [root=/dev/sda1]\n",
            "kernelArgs[0]",
            "installer",
        ),
    ] {
        let f = write(dir.path(), "bad.yaml", yaml);
        let o = validate(&["-f", &f]);
        assert_eq!(o.status.code(), Some(2), "{yaml}: {}", common::err(&o));
        let e = common::err(&o);
        assert!(
            e.contains(&format!("invalid spec {f}: {field}: ")) && e.contains(fix),
            "{yaml}: {e}"
        );
        let o = validate(&["-f", &f, "-o", "json"]);
        assert_eq!(o.status.code(), Some(2));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (v["valid"].clone(), v["field"].clone()),
            (false.into(), field.into())
        );
    }
    let o = validate(&["-f", &dir.path().join("missing.yaml").display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", common::err(&o));
}

#[test]
fn the_message_is_the_agents() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let spec = node.spec("bad.yaml", "kernelArgs: [isolcpus=2,4]\n");
    let agent = node.ctl(&["apply", "--dry-run", "-f", &spec]);
    assert_eq!(agent.status.code(), Some(2), "{}", common::err(&agent));
    // no gRPC jargon: the agent's refusal reads as the client's own
    assert!(
        common::err(&agent).contains("inplacectl: error: invalid spec: kernelArgs[1]: "),
        "{}",
        common::err(&agent)
    );
    let offline = validate(&["-f", &spec]);
    assert_eq!(offline.status.code(), Some(2));
    // the agent's text after its status code, the validator's after the file name
    let tail = |s: &str| s[s.find("kernelArgs[1]: ").expect(s)..].trim().to_string();
    assert_eq!(
        tail(&common::err(&offline)),
        tail(&common::err(&agent)),
        "offline and agent messages differ"
    );
    node.stop();
}

#[test]
fn the_shipped_json_schema_is_the_one_the_types_give() {
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/nodespec.schema.json"),
    )
    .unwrap();
    let generated = serde_json::to_string_pretty(&inplace_wire::yaml::json_schema()).unwrap();
    assert_eq!(
        shipped,
        format!("{generated}\n"),
        "docs/nodespec.schema.json is stale: cargo run --example gen-docs -- target/assets && cp target/assets/nodespec.schema.json docs/"
    );
    let v: serde_json::Value = serde_json::from_str(&shipped).unwrap();
    // a misspelt section is refused, as the parser refuses it
    assert_eq!(v["additionalProperties"], false);
    assert_eq!(v["properties"]["kernelArgs"]["items"]["type"], "string");
    assert_eq!(
        v["$defs"]["YamlFile"]["properties"]["mode"]["pattern"],
        "^[0-7]{3,4}$"
    );
}
