//! Generates the demo PKI for `examples/extension-demo.sh` into a directory:
//!
//! - `agents-ca.crt`, `agent.crt`, `agent.key`: the agents' server identity (SANs
//!   `localhost`, `127.0.0.1`);
//! - `clients-ca.crt`, `client.crt`, `client.key`: the extension's client identity (URI SAN
//!   `spiffe://mgmt/ns/inplace-system/sa/inplace-extension`, role admin on the agents);
//! - `extension-ca.crt`, `extension.crt`, `extension.key`: the extension's HTTPS identity
//!   (SANs `localhost`, `127.0.0.1`, `inplace-extension.inplace-system.svc`); the CA is what
//!   an ExtensionConfig's `caBundle` holds;
//! - `capi-ca.crt`, `capi.crt`, `capi.key`: the client identity of CAPI's managers (URI SAN
//!   `spiffe://mgmt/ns/capi-system/sa/capi-manager`), which they present to the extension
//!   when started with `--runtime-extension-client-cert-file` / `-key-file`.
//!
//! On real clusters these come from cert-manager (extension) and the node PKI (agents).
//! Usage: `cargo run --example gen-certs -- <dir>`.

use rcgen::SanType;

// The same CA and leaf helpers the tests use.
#[allow(dead_code)]
#[path = "../tests/common/pki.rs"]
mod pki;

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    std::fs::create_dir_all(&dir)?;
    let dns = |s: &str| SanType::DnsName(s.try_into().expect("dns name"));
    let local = || {
        vec![
            dns("localhost"),
            SanType::IpAddress("127.0.0.1".parse().expect("ip")),
        ]
    };
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text);

    let agents = pki::ca("inplaced agents CA");
    let (c, k) = pki::leaf(&agents, "inplaced", local());
    write("agents-ca.crt", &agents.pem)?;
    write("agent.crt", &c)?;
    write("agent.key", &k)?;

    let clients = pki::ca("inplaced clients CA");
    let uri = "spiffe://mgmt/ns/inplace-system/sa/inplace-extension";
    let (c, k) = pki::leaf(
        &clients,
        "inplace-extension",
        vec![SanType::URI(uri.try_into().expect("uri"))],
    );
    write("clients-ca.crt", &clients.pem)?;
    write("client.crt", &c)?;
    write("client.key", &k)?;

    let ext = pki::ca("inplace-extension CA");
    let mut sans = local();
    sans.push(dns("inplace-extension.inplace-system.svc"));
    let (c, k) = pki::leaf(&ext, "inplace-extension", sans);
    write("extension-ca.crt", &ext.pem)?;
    write("extension.crt", &c)?;
    write("extension.key", &k)?;

    let capi = pki::ca("CAPI runtime extension clients CA");
    let uri = "spiffe://mgmt/ns/capi-system/sa/capi-manager";
    let (c, k) = pki::leaf(
        &capi,
        "capi-manager",
        vec![SanType::URI(uri.try_into().expect("uri"))],
    );
    write("capi-ca.crt", &capi.pem)?;
    write("capi.crt", &c)?;
    write("capi.key", &k)?;
    println!("wrote the demo PKI to {}", dir.display());
    Ok(())
}
