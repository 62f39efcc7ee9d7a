//! Prometheus metrics, black box: the real daemon on a fixture copy, scraped over HTTP on
//! loopback and read from its node_exporter textfile, after real operations.

mod common;

use std::time::{Duration, Instant};

use common::Node;
use common::pki::free_port;
use common::scrape::{sample, scrape, scrape_accepting};

#[test]
fn metrics_follow_operations_over_http_and_the_textfile() {
    let mut node = Node::new("ubuntu-2404-grub");
    let addr = format!("127.0.0.1:{}", free_port());
    // a node path, written under --root
    let textfile = node.path("/var/lib/node_exporter/textfile_collector/inplaced.prom");
    std::fs::create_dir_all(textfile.parent().unwrap()).unwrap();
    std::fs::write(
        &node.config,
        format!(
            "[metrics]\nlisten = \"{addr}\"\ntextfile = \"/var/lib/node_exporter/textfile_collector/inplaced.prom\"\n"
        ),
    )
    .unwrap();
    node.start();
    let (head, body) = scrape(&addr);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(
        body.contains(
            "inplaced_build_info{version=\"0.1.0\",kernel_args_backend=\"grub\",platform=\"bare-metal\"} 1"
        ),
        "{body}"
    );
    assert_eq!(sample(&body, "inplaced_managed_items"), Some(0.0));
    assert!(
        body.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );

    // every final phase at 0 from the start, so increase() sees the first one
    for phase in ["Succeeded", "Failed", "RolledBack"] {
        let name = format!("inplaced_operations_total{{phase=\"{phase}\"}}");
        assert_eq!(sample(&body, &name), Some(0.0), "{body}");
    }
    // curl and promtool get the text format 0.0.4: a counter's family carries _total
    let (head, text) = scrape_accepting(&addr, "*/*");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert!(
        text.contains("# TYPE inplaced_operations_total counter\n"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");

    let spec = node.spec("a.yaml", "kubelet:\n  flags:\n    max-pods: \"250\"\n");
    let o = node.ctl(&["apply", "-f", &spec, "--id", "flags", "--wait"]);
    assert!(o.status.success(), "{}", common::err(&o));
    let o = node.ctl(&["coverage", "-f", &spec]);
    assert!(o.status.success());
    let spec = node.spec(
        "b.yaml",
        "kubelet:\n  flags:\n    max-pods: \"250\"\nkernelArgs: [isolcpus=2-7]\n",
    );
    let o = node.ctl(&["apply", "-f", &spec, "--id", "kargs", "--wait"]);
    assert!(o.status.success(), "{}", common::err(&o));

    let (_, body) = scrape(&addr);
    assert_eq!(
        sample(&body, "inplaced_operations_total{phase=\"Succeeded\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "inplaced_pending_reboot{operation=\"kargs\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "inplaced_last_operation_result{phase=\"Succeeded\"}"),
        Some(1.0)
    );
    // the kubelet flag and the staged kernel argument
    assert_eq!(sample(&body, "inplaced_managed_items"), Some(2.0), "{body}");
    assert!(sample(&body, "inplaced_coverage_duration_seconds_count").unwrap() >= 1.0);
    assert_eq!(
        sample(&body, "inplaced_apply_duration_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "inplaced_journal_recoveries_total"),
        Some(0.0)
    );

    // the textfile catches up within its 5 s refresh
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t = std::fs::read_to_string(&textfile).unwrap_or_default();
        if sample(&t, "inplaced_pending_reboot{operation=\"kargs\"}") == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "textfile never showed the pending reboot: {t}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // node_exporter's textfile collector reads the text format 0.0.4
    let t = std::fs::read_to_string(&textfile).unwrap();
    assert!(
        t.contains("# TYPE inplaced_operations_total counter\n") && !t.contains("# EOF"),
        "{t}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&textfile).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o644);
    assert!(
        std::fs::read_dir(textfile.parent().unwrap())
            .unwrap()
            .all(|e| e.unwrap().file_name() == "inplaced.prom"),
        "no temporary file is left"
    );
    node.stop();
}

/// Off loopback the metrics listener needs the mutual TLS of `[api.tcp]`; without it the
/// daemon does not start, and says which key to set.
#[test]
fn metrics_off_loopback_need_mutual_tls() {
    let node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[metrics]\nlisten = \"0.0.0.0:0\"\n").unwrap();
    let out = node.daemon().output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("metrics.listen 0.0.0.0:0 is not a loopback address")
            && e.contains("api.tcp.cert"),
        "{e}"
    );
}

/// README's "Install on a node" edit (the same script the VM test runs) fills in the
/// `[api.tcp]` table and no other: `[metrics]` has a `listen` key too, and the first
/// version of the edit set the metrics listener to the API's port.
#[test]
fn the_install_edit_sets_the_api_listener_only() {
    let dir = common::tempdir();
    let cfg = dir.path().join("config.toml");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/config.toml"),
        &cfg,
    )
    .unwrap();
    let o = std::process::Command::new("sh")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/vm/agent-config.sh"
        ))
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = inplace_agent::config::Config::load(&cfg, true).unwrap();
    assert_eq!(c.api.tcp.listen, "0.0.0.0:9443");
    assert_eq!(c.api.tcp.cert, "/etc/inplaced/tls/server.crt");
    assert_eq!(c.api.tcp.clients.len(), 1);
    assert_eq!(c.metrics.listen, "");
}

/// Off loopback the metrics are served over HTTPS with `[api.tcp]`'s mutual TLS, to a
/// scraper that offers ALPN `http/1.1` as curl and Prometheus do (the listener shared the
/// API's `h2`-only acceptor, and every such handshake failed with "no application
/// protocol"); an allowlisted reader gets the metrics, a certificate off the list nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_off_loopback_serve_an_http1_scraper_over_mutual_tls() {
    use common::pki::{ca, leaf, write};
    use rcgen::SanType;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut node = Node::new("ubuntu-2404-grub");
    let d = node.dir.path().to_path_buf();
    let server_ca = ca("agents CA");
    let client_ca = ca("clients CA");
    let server = leaf(
        &server_ca,
        "node",
        vec![SanType::DnsName("localhost".try_into().unwrap())],
    );
    let (api, port) = (free_port(), free_port());
    std::fs::write(
        &node.config,
        format!(
            "[metrics]\nlisten = \"0.0.0.0:{port}\"\n\
             [api.tcp]\nlisten = \"127.0.0.1:{api}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [[api.tcp.clients]]\nidentity = \"prometheus.example.com\"\nrole = \"reader\"\n",
            write(&d, "s.crt", &server.0),
            write(&d, "s.key", &server.1),
            write(&d, "ca.crt", &client_ca.pem),
        ),
    )
    .unwrap();
    node.start();
    let scrape = |cert: (String, String)| {
        let server_ca = server_ca.pem.clone();
        async move {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(server_ca.as_bytes()).unwrap())
                .unwrap();
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.0.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(cert.1.as_bytes()).unwrap(),
                )
                .unwrap();
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await?;
            tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await?;
            let mut out = String::new();
            tls.read_to_string(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        }
    };
    let reader = leaf(
        &client_ca,
        "prometheus",
        vec![SanType::DnsName(
            "prometheus.example.com".try_into().unwrap(),
        )],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        match scrape(reader.clone()).await {
            Ok(out) => break out,
            Err(e) => {
                assert!(Instant::now() < deadline, "never served: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("inplaced_build_info{"), "{out}");
    let stranger = leaf(&client_ca, "stranger", vec![]);
    let r = scrape(stranger).await;
    assert!(
        r.as_ref()
            .map_or(true, |o| !o.contains("inplaced_build_info")),
        "{r:?}"
    );
}
