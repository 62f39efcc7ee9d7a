//! The remote API over TCP with mutual TLS: roles from an allowlist of client identities,
//! refusal of missing, foreign and unlisted certificates, certificate rotation without
//! restart, and no plaintext except on loopback.

mod common;

use common::pki::{Ca, ca, free_port, leaf, write};
use common::{Node, err, spec};
use inplace_edge::client::{TlsIdentity, connect_tls};
use inplace_wire::pb;
use rcgen::SanType;

fn id(ca: &Ca, cert: &(String, String)) -> TlsIdentity {
    TlsIdentity {
        ca: ca.pem.clone().into_bytes(),
        cert: cert.0.clone().into_bytes(),
        key: cert.1.clone().into_bytes(),
        server_name: "localhost".into(),
    }
}

async fn status(addr: &str, who: &TlsIdentity) -> Result<pb::NodeStatus, String> {
    let mut c = connect_tls(addr, who).await.map_err(|e| format!("{e:#}"))?;
    c.get_status(pb::GetStatusRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_allowlist_refusals_and_rotation() {
    let mut node = Node::new("ubuntu-2404-grub");
    let d = node.dir.path().to_path_buf();
    let server_ca = ca("inplaced server CA");
    let client_ca = ca("clients CA");
    let other_ca = ca("someone else");
    let server = leaf(
        &server_ca,
        "node-1",
        vec![SanType::DnsName("localhost".try_into().unwrap())],
    );
    let admin = leaf(
        &client_ca,
        "capi-extension",
        vec![SanType::URI(
            "spiffe://edge/capi/extension".try_into().unwrap(),
        )],
    );
    let reader = leaf(&client_ca, "monitoring", vec![]);
    let stranger = leaf(&client_ca, "stranger", vec![]);
    let foreign = leaf(
        &other_ca,
        "capi-extension",
        vec![SanType::URI(
            "spiffe://edge/capi/extension".try_into().unwrap(),
        )],
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    std::fs::write(
        &node.config,
        format!(
            "[api.tcp]\nlisten = \"{addr}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [[api.tcp.clients]]\nidentity = \"spiffe://edge/capi/extension\"\nrole = \"admin\"\n\
             [[api.tcp.clients]]\nidentity = \"monitoring\"\nmatch = \"cn\"\nrole = \"reader\"\n",
            write(&d, "server.crt", &server.0),
            write(&d, "server.key", &server.1),
            write(&d, "clients-ca.crt", &client_ca.pem),
        ),
    )
    .unwrap();
    node.log_file = Some(d.join("agent.log"));
    node.start();

    // admin: reads and applies
    let s = status(&addr, &id(&server_ca, &admin)).await.unwrap();
    assert_eq!(s.facts.unwrap().platform, "bare-metal");
    let mut c = connect_tls(&addr, &id(&server_ca, &admin)).await.unwrap();
    let op = c
        .apply(pb::ApplyRequest {
            desired: Some(spec("kubelet:\n  flags:\n    max-pods: \"250\"\n")),
            operation_id: "remote".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(op.id, "remote");
    assert_eq!(
        node.settle("remote").await.phase,
        pb::Phase::Succeeded as i32
    );

    // reader: reads, may not apply
    status(&addr, &id(&server_ca, &reader)).await.unwrap();
    let mut c = connect_tls(&addr, &id(&server_ca, &reader)).await.unwrap();
    let e = c
        .apply(pb::ApplyRequest {
            desired: Some(spec("{}")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);

    // valid certificate, not on the allowlist: disconnected right after the handshake,
    // before any request is read (health and reflection included)
    let e = status(&addr, &id(&server_ca, &stranger)).await.unwrap_err();
    assert!(!e.starts_with("Ok"), "{e}");
    let mut h = connect_tls(&addr, &id(&server_ca, &stranger)).await;
    if let Ok(c) = &mut h {
        assert!(c.get_status(pb::GetStatusRequest {}).await.is_err());
    }
    assert!(
        node.log()
            .contains("not on the allowlist (api.tcp.clients): disconnected")
            && node.log().contains("stranger"),
        "the refusal is logged with the identities"
    );
    // signed by another CA: the handshake fails
    assert!(status(&addr, &id(&server_ca, &foreign)).await.is_err());
    // no client certificate at all: a plain TLS client is refused
    let no_cert = {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        use rustls_pki_types::pem::PemObject;
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(server_ca.pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let r = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
            .connect("localhost".try_into().unwrap(), tcp)
            .await;
        match r {
            Err(e) => Err(e.to_string()),
            Ok(mut s) => {
                // TLS 1.3 reports the refusal on the first read
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
                let mut b = [0u8; 16];
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => Err("refused".to_string()),
                    Ok(_) => Ok(()),
                }
            }
        }
    };
    assert!(
        no_cert.is_err(),
        "a client without a certificate must be refused"
    );

    // rotation: a new server certificate from a new CA is served without a restart
    let new_ca = ca("rotated server CA");
    let new_server = leaf(
        &new_ca,
        "node-1",
        vec![SanType::DnsName("localhost".try_into().unwrap())],
    );
    // write the key first, then the certificate (a real rotation replaces both)
    write(&d, "server.key", &new_server.1);
    write(&d, "server.crt", &new_server.0);
    status(&addr, &id(&new_ca, &admin)).await.unwrap();
    assert!(
        status(&addr, &id(&server_ca, &admin)).await.is_err(),
        "old server CA must no longer verify"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_tcp_only_on_loopback() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        "[api.tcp]\nlisten = \"0.0.0.0:0\"\ninsecure_loopback = true\n",
    )
    .unwrap();
    let o = node.daemon().output().unwrap();
    assert!(!o.status.success());
    assert!(
        err(&o).contains("only allowed on a loopback address"),
        "{}",
        err(&o)
    );
    std::fs::write(&node.config, "[api.tcp]\nlisten = \"0.0.0.0:0\"\n").unwrap();
    let o = node.daemon().output().unwrap();
    assert!(err(&o).contains("mutual TLS only"), "{}", err(&o));
    let port = free_port();
    std::fs::write(
        &node.config,
        format!("[api.tcp]\nlisten = \"127.0.0.1:{port}\"\ninsecure_loopback = true\n"),
    )
    .unwrap();
    node.start();
    let ch = tonic::transport::Endpoint::try_from(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = pb::node_agent_client::NodeAgentClient::new(ch);
    c.get_status(pb::GetStatusRequest {}).await.unwrap();
    let e = c
        .apply(pb::ApplyRequest {
            desired: Some(spec("{}")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::PermissionDenied,
        "loopback callers are readers by default"
    );
}
