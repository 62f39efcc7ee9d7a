//! Who may drive the extension and the agent, and what no caller can exhaust: the real
//! `inplace-extension` and `inplaced` binaries, flooded and probed over loopback only,
//! every flood bounded in count and time.

mod common;

use common::capi::{CAPI_ID, Extension, Pki, fixture, one_agent};
use common::pki::{ca, free_port, leaf, write};
use common::*;
use inplace_wire::pb;
use rcgen::SanType;
use serde_json::{Value, json};
use std::io::Read as _;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const UPDATE: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/updatemachine/update-machine";
const DISCOVERY: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery";

fn update_request() -> Value {
    let can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    common::capi::update_request(&can)
}

/// A TCP listener that counts the connections it is offered (a stand-in agent that
/// speaks no TLS: the extension can only fail to talk to it).
fn counting_listener() -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(c);
        }
    });
    (addr, n)
}

/// CPU time of a process so far (user + system), seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Only a client certificate from CAPI's CA that is on `[[server.clients]]` reaches a
/// handler; everything else is refused before the request is read and no agent is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_capi_may_call_the_extension() {
    let pki = Pki::new();
    let (agent, offered) = counting_listener();
    let ext = Extension::start(&pki, &[("site-a/edge-1-cp-7xk2p", &agent)], "");
    let req = update_request();
    let uri = |u: &str| SanType::URI(u.try_into().unwrap());
    let foreign_ca = ca("someone else's CA");
    let refused = [
        ("no certificate", None),
        (
            "the right identity from another CA",
            Some(leaf(&foreign_ca, "capi-manager", vec![uri(CAPI_ID)])),
        ),
        (
            "an unlisted identity from CAPI's CA",
            Some(leaf(
                &pki.capi_ca,
                "intruder",
                vec![uri("spiffe://mgmt/ns/default/sa/intruder")],
            )),
        ),
        (
            "an unlisted URI SAN with the listed identity as its CN",
            Some(leaf(
                &pki.capi_ca,
                CAPI_ID,
                vec![uri("spiffe://mgmt/ns/default/sa/intruder")],
            )),
        ),
    ];
    for (what, client) in &refused {
        let r = ext.post_as(client.as_ref(), UPDATE, &req).await;
        assert!(r.is_err(), "{what}: answered {r:?}");
    }
    assert_eq!(offered.load(Ordering::SeqCst), 0, "no agent was asked");
    assert!(
        ext.log()
            .contains("client certificate not on the allowlist (server.clients): disconnected"),
        "{}",
        ext.log()
    );
    // The listed identity is answered (the stand-in agent speaks no TLS: waiting).
    let (status, v) = ext
        .post_as(ext.client.as_ref(), UPDATE, &req)
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "Success", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("waiting for the node agent"),
        "{v}"
    );
    assert!(offered.load(Ordering::SeqCst) >= 1);
}

/// The allowlist and its match kinds are re-read when the config file changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_allowlist_reloads_without_restart() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let disco = json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"});
    assert_eq!(ext.post(DISCOVERY, &disco).await.0, 200);
    let ops = leaf(&pki.capi_ca, "ops-console", vec![]);
    assert!(ext.post_as(Some(&ops), DISCOVERY, &disco).await.is_err());
    let text = std::fs::read_to_string(&ext.config).unwrap();
    let new = text.replace(
        &format!("[[server.clients]]\nidentity = \"{CAPI_ID}\"\n"),
        "[[server.clients]]\nidentity = \"ops-console\"\nmatch = \"cn\"\n",
    );
    assert_ne!(text, new);
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&ext.config, new).unwrap();
    let (status, _) = ext.post_as(Some(&ops), DISCOVERY, &disco).await.unwrap();
    assert_eq!(status, 200, "the CN entry admits the new caller");
    assert!(
        ext.post_as(ext.client.as_ref(), DISCOVERY, &disco)
            .await
            .is_err(),
        "the removed identity is refused"
    );
    // A broken edit keeps the last good allowlist.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&ext.config, "[server\n").unwrap();
    assert_eq!(
        ext.post_as(Some(&ops), DISCOVERY, &disco).await.unwrap().0,
        200
    );
}

/// The extension's allowlist follows the agent's rule: CAPI's URI identity is matched by
/// a URI SAN only. Certificates from the trusted CA whose CN is CAPI's identity text, with
/// no SAN, with a DNS SAN, or with another URI SAN, are refused at the connection; a CN
/// entry needs `match = "cn"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_matches_a_uri_identity_by_uri_san_only() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let disco = json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"});
    assert_eq!(
        ext.post(DISCOVERY, &disco).await.0,
        200,
        "CAPI's real certificate"
    );
    let forged = [
        leaf(&pki.capi_ca, CAPI_ID, vec![]),
        leaf(
            &pki.capi_ca,
            CAPI_ID,
            vec![SanType::DnsName("capi.example.com".try_into().unwrap())],
        ),
        leaf(
            &pki.capi_ca,
            CAPI_ID,
            vec![SanType::URI(
                "spiffe://mgmt/ns/dev/sa/editor".try_into().unwrap(),
            )],
        ),
    ];
    for (i, cert) in forged.iter().enumerate() {
        assert!(
            ext.post_as(Some(cert), DISCOVERY, &disco).await.is_err(),
            "forged certificate {i} was answered"
        );
        let r = ext.post_as(Some(cert), UPDATE, &update_request()).await;
        assert!(
            r.is_err(),
            "forged certificate {i} reached UpdateMachine: {r:?}"
        );
    }
}

/// UpdateMachine never changes a node that is not the Machine's: a resolver that points
/// Machine edge-1-cp-7xk2p at another node's agent gets a Failure naming both, and that
/// node is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_machine_refuses_another_nodes_agent() {
    // the systemd-boot fixture is node edge-1-md-0-5f8c7d9b4x-k2v9w
    let (_pki, node, ext) = one_agent("systemd-boot", "site-a/edge-1-cp-7xk2p", |_| {});
    let before = snapshot(&node.root);
    let r = ext.update_machine(&update_request()).await;
    assert_eq!(r["status"], "Failure", "{r}");
    assert_eq!(r["retryAfterSeconds"], 0, "{r}");
    let msg = r["message"].as_str().unwrap();
    assert!(
        msg.contains("is node \"edge-1-md-0-5f8c7d9b4x-k2v9w\", not Machine site-a/edge-1-cp-7xk2p's node \"edge-1-cp-7xk2p\": nothing was changed"),
        "{msg}"
    );
    assert!(node.operations().await.is_empty());
    assert_eq!(snapshot(&node.root), before);
    // a status.nodeRef.name in the request naming the other node changes nothing: the
    // request is not trusted to say which node it may change (resolver.trust_node_ref)
    let mut req = update_request();
    req["desired"]["machine"]["status"] =
        json!({"nodeRef": {"name": "edge-1-md-0-5f8c7d9b4x-k2v9w"}});
    let r = ext.update_machine(&req).await;
    assert_eq!(r["status"], "Failure", "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("not Machine"),
        "{r}"
    );
    assert!(node.operations().await.is_empty());
    assert_eq!(snapshot(&node.root), before);
}

fn scrape_agent_metrics(addr: &str) -> String {
    use std::io::Write as _;
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// An address taken from a Machine annotation can point at any agent: the node check runs
/// first, on the agent's status alone, and a wrong node never receives the desired spec
/// (file contents) in either hook. Machines of a namespace not listed in
/// `resolver.namespaces` are refused before any agent is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotation_resolver_sends_no_spec_before_the_node_check() {
    let pki = Pki::new();
    // the systemd-boot fixture is node edge-1-md-0-5f8c7d9b4x-k2v9w, not edge-1-cp-7xk2p
    let mut node = Node::new("systemd-boot");
    let addr = pki.agent(&node);
    // the agent's certificate names its Machine's namespace (agent.server_name below)
    let cert = leaf(
        &pki.agent_ca,
        "node",
        vec![SanType::DnsName(
            "site-a.agents.invalid".try_into().unwrap(),
        )],
    );
    write(node.dir.path(), "server.crt", &cert.0);
    write(node.dir.path(), "server.key", &cert.1);
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut cfg = std::fs::read_to_string(&node.config).unwrap();
    cfg.push_str(&format!("[metrics]\nlisten = \"{metrics}\"\n"));
    std::fs::write(&node.config, cfg).unwrap();
    node.start();
    let ext = Extension::start_resolving(
        &pki,
        &[],
        "",
        "debug",
        (
            "server_name = \"{namespace}.agents.invalid\"\n",
            "template = \"{annotation:inplaced.io/agent}\"\nnamespaces = [\"site-a\"]\n",
        ),
    );
    let mut can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    assert_eq!(can["desired"]["machine"]["metadata"]["namespace"], "site-a");
    for side in ["desired", "current"] {
        can[side]["machine"]["metadata"]["annotations"]["inplaced.io/agent"] = json!(addr);
    }
    let v = ext.can_update_machine(&can).await;
    assert_eq!(v["status"], "Failure", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains(
            "is node \"edge-1-md-0-5f8c7d9b4x-k2v9w\", not Machine site-a/edge-1-cp-7xk2p's node"
        ),
        "{v}"
    );
    let mut upd = update_request();
    upd["desired"] = can["desired"].clone();
    let r = ext.update_machine(&upd).await;
    assert_eq!(r["status"], "Failure", "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("not Machine site-a/edge-1-cp-7xk2p's node"),
        "{r}"
    );
    // the agent planned nothing: no coverage was asked of it, no operation started
    let m = scrape_agent_metrics(&metrics);
    assert!(
        m.contains("inplaced_coverage_duration_seconds_count 0"),
        "{m}"
    );
    assert!(node.operations().await.is_empty());
    // another namespace: refused by name, no agent asked
    let mut other = can.clone();
    other["desired"]["machine"]["metadata"]["namespace"] = json!("site-b");
    let v = ext.can_update_machine(&other).await;
    assert_eq!(v["status"], "Failure", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("Machine site-b/edge-1-cp-7xk2p is in a namespace this extension does not serve (resolver.namespaces: [\"site-a\"])"),
        "{v}"
    );
    let mut upd = update_request();
    upd["desired"] = other["desired"].clone();
    let r = ext.update_machine(&upd).await;
    assert!(
        r["message"].as_str().unwrap().contains("does not serve"),
        "{r}"
    );
    assert!(scrape_agent_metrics(&metrics).contains("inplaced_coverage_duration_seconds_count 0"));
}

/// A resolver that could send a Machine of one namespace to the node of another is
/// refused at start-up, naming resolver.template and the fixes: an address from an
/// annotation or a label, or a host without {namespace}, unless the agent's certificate
/// name or resolver.namespaces binds the namespace.
#[test]
fn resolvers_that_cross_namespaces_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[server]\nlisten = \"127.0.0.1:9443\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                [[server.clients]]\nidentity = \"spiffe://mgmt/capi\"\n";
    let load = |agent: &str, resolver: &str| {
        let cfg = write(
            dir.path(),
            "x.toml",
            &format!(
                "{base}[agent]\nca = \"a\"\ncert = \"c\"\nkey = \"k\"\n{agent}[resolver]\n{resolver}"
            ),
        );
        inplace_extension::config::Config::load(std::path::Path::new(&cfg)).map(|_| ())
    };
    for (agent, resolver) in [
        ("", "template = \"{annotation:inplaced.io/agent}\"\n"),
        ("", "template = \"{name}.nodes.example.com:7443\"\n"),
        (
            "",
            "template = \"{label:rack}.{namespace}.example.com:7443\"\n",
        ),
        (
            "server_name = \"{annotation:tls}\"\n",
            "template = \"{annotation:addr}\"\n",
        ),
        (
            "",
            "template = \"{name}:7443\"\nnamespaces = [\"a\", \"b\"]\n",
        ),
        // one namespace served does not bind an address from an annotation (it can name
        // any agent that trusts the extension)
        (
            "",
            "template = \"{annotation:addr}\"\nnamespaces = [\"site-a\"]\n",
        ),
        // {namespace} joined to other text: edge-1 in cp-x and edge-1-cp in x collide
        (
            "",
            "template = \"{name}-{namespace}.nodes.example.com:7443\"\n",
        ),
        (
            "server_name = \"{name}-{namespace}\"\n",
            "template = \"{annotation:addr}\"\n",
        ),
    ] {
        let e = load(agent, resolver).unwrap_err().to_string();
        assert!(
            e.contains("resolver.template") && e.contains("resolver.namespaces"),
            "{resolver}: {e}"
        );
    }
    for (agent, resolver) in [
        (
            "",
            "template = \"{name}.{namespace}.nodes.example.com:7443\"\n",
        ),
        (
            "server_name = \"{name}.{namespace}.agents.example.com\"\n",
            "template = \"{annotation:addr}\"\n",
        ),
        (
            "",
            "template = \"{name}:7443\"\nnamespaces = [\"site-a\"]\n",
        ),
        ("", "[resolver.static]\n\"site-a/m\" = \"10.0.0.1:7443\"\n"),
    ] {
        load(agent, resolver).unwrap_or_else(|e| panic!("{resolver}: {e}"));
    }
}

/// Strings from a request never forge a log line or drive a terminal: a Machine name with
/// a newline, a carriage return, an ANSI escape and a bidirectional override reaches the
/// extension's log (as a field, and inside a message) escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_strings_can_not_forge_log_lines() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let mut can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let forged = "edge-1\nFORGED INFO all nodes updated\r\u{1b}[2J\u{202e}txt";
    can["desired"]["machine"]["metadata"]["name"] = json!(forged);
    let v = ext.can_update_machine(&can).await;
    assert_eq!(v["status"], "Failure", "{v}");
    let log = std::fs::read_to_string(&ext.log).unwrap();
    assert!(
        log.contains(
            "machine=\"site-a/edge-1\\nFORGED INFO all nodes updated\\r\\u{1b}[2J\\u{202e}txt\""
        ),
        "{log}"
    );
    assert!(!log.lines().any(|l| l.starts_with("FORGED")), "{log}");
    assert!(!log.contains(['\r', '\u{1b}', '\u{202e}']), "{log}");
}

/// The agent's allowlist: a certificate no entry matches is disconnected before any
/// call (health included). An entry is compared with one kind of name only: a URI entry
/// with URI SANs, any other entry with DNS SANs, and the subject CN only for an entry
/// declared `match = "cn"`. A certificate whose free-text CN equals an entry (the issuer
/// lets the requester pick it) and that carries no SAN of the entry's kind never matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_identity_matching_is_explicit() {
    use inplace_edge::client::{TlsIdentity, connect_tls};
    const CAPI_EXT: &str = "spiffe://mgmt/ns/inplace-system/sa/inplace-extension";
    let mut node = Node::new("ubuntu-2404-grub");
    let d = node.dir.path().to_path_buf();
    let server_ca = ca("agents CA");
    let client_ca = ca("clients CA");
    let server = leaf(
        &server_ca,
        "node",
        vec![SanType::DnsName("localhost".try_into().unwrap())],
    );
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &node.config,
        format!(
            "[api.tcp]\nlisten = \"{addr}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [[api.tcp.clients]]\nidentity = \"{CAPI_EXT}\"\nrole = \"admin\"\n\
             [[api.tcp.clients]]\nidentity = \"ops-admin.example.com\"\nrole = \"admin\"\n\
             [[api.tcp.clients]]\nidentity = \"monitoring\"\nmatch = \"cn\"\nrole = \"reader\"\n",
            write(&d, "s.crt", &server.0),
            write(&d, "s.key", &server.1),
            write(&d, "ca.crt", &client_ca.pem),
        ),
    )
    .unwrap();
    node.log_file = Some(d.join("agent.log"));
    node.start();
    let who = |c: &(String, String)| TlsIdentity {
        ca: server_ca.pem.clone().into_bytes(),
        cert: c.0.clone().into_bytes(),
        key: c.1.clone().into_bytes(),
        server_name: "localhost".into(),
    };
    let status = |id: TlsIdentity| {
        let addr = addr.clone();
        async move {
            let mut c = connect_tls(&addr, &id)
                .await
                .map_err(|e| format!("{e:#}"))?;
            c.get_status(pb::GetStatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
        }
    };
    let apply = |id: TlsIdentity| {
        let addr = addr.clone();
        async move {
            let mut c = connect_tls(&addr, &id)
                .await
                .map_err(|e| format!("{e:#}"))?;
            c.apply(pb::ApplyRequest {
                desired: Some(pb::NodeSpec::default()),
                operation_id: "probe".into(),
                dry_run: true,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
        }
    };
    let uri = |u: &str| SanType::URI(u.try_into().unwrap());
    let dns = |n: &str| SanType::DnsName(n.try_into().unwrap());
    // The class "a CN passes for a SAN entry", each member refused before any call:
    // 1. no SAN, CN = the URI entry's text
    let forged_uri = leaf(&client_ca, CAPI_EXT, vec![]);
    // 2. no SAN, CN = the DNS entry's text
    let forged_dns = leaf(&client_ca, "ops-admin.example.com", vec![]);
    // 3. a SAN of another kind (a DNS SAN) and CN = the URI entry's text
    let forged_mixed = leaf(&client_ca, CAPI_EXT, vec![dns("elsewhere.example.com")]);
    // 4. a URI SAN of another identity and CN = the DNS entry's text
    let forged_other_uri = leaf(
        &client_ca,
        "ops-admin.example.com",
        vec![uri("spiffe://mgmt/ns/x/sa/anything")],
    );
    for (what, cert) in [
        ("CN = URI entry, no SAN", &forged_uri),
        ("CN = DNS entry, no SAN", &forged_dns),
        ("CN = URI entry, DNS SAN", &forged_mixed),
        ("CN = DNS entry, other URI SAN", &forged_other_uri),
    ] {
        let e = status(who(cert)).await.expect_err(what);
        assert!(!e.starts_with("Ok"), "{what}: {e}");
        let e = apply(who(cert)).await.expect_err(what);
        assert!(
            !e.starts_with("PermissionDenied"),
            "{what}: disconnected, not answered: {e}"
        );
    }
    // the refusal says why a CN-only certificate that looks listed is refused
    let log = node.log();
    assert!(
        log.contains("compare SANs only: a CN is matched only by an entry with match = \"cn\""),
        "{log}"
    );
    // The same names as SANs of their own kind: admin (a dry-run Apply is allowed)
    let real_uri = leaf(&client_ca, "anything", vec![uri(CAPI_EXT)]);
    let s = status(who(&real_uri)).await.unwrap();
    assert_eq!(s.facts.unwrap().node_name, "edge-1-cp-7xk2p");
    apply(who(&real_uri)).await.unwrap();
    let real_dns = leaf(&client_ca, "anything", vec![dns("ops-admin.example.com")]);
    apply(who(&real_dns)).await.unwrap();
    // An entry declared match = "cn" reads the CN, even next to a URI SAN: reader
    let monitoring = leaf(
        &client_ca,
        "monitoring",
        vec![uri("spiffe://mgmt/ns/x/sa/y")],
    );
    status(who(&monitoring)).await.unwrap();
    let e = apply(who(&monitoring)).await.unwrap_err();
    assert!(e.starts_with("PermissionDenied"), "{e}");
    // ... and only the CN: a DNS SAN "monitoring" is not the reader
    let dns_monitoring = leaf(&client_ca, "someone", vec![dns("monitoring")]);
    assert!(status(who(&dns_monitoring)).await.is_err());
    // an unlisted certificate is disconnected at the connection, before any service
    // (health and reflection included) reads a request
    let stranger = leaf(&client_ca, "stranger", vec![]);
    assert!(status(who(&stranger)).await.is_err());
    assert!(node.log().contains("stranger"));
}

/// An allowlist entry whose `match` kind contradicts its text is refused at start-up,
/// naming the entry and the fix, on both programs (it could never match as written).
#[test]
fn allowlist_entries_that_can_not_match_are_refused_at_load() {
    for (entry, want) in [
        (
            "identity = \"ops-admin\"\nmatch = \"uri\"\n",
            "api.tcp.clients[0]: match = \"uri\" but \"ops-admin\" is no URI",
        ),
        (
            "identity = \"system:node:edge-1\"\nmatch = \"dns\"\n",
            "api.tcp.clients[0].identity \"system:node:edge-1\" (match = \"dns\"): no DNS name",
        ),
        ("identity = \"\"\n", "api.tcp.clients[0].identity: empty"),
        // a kind that would be guessed wrong is refused rather than guessed
        (
            "identity = \"system:node:edge-1\"\n",
            "has no \"//\": for a subject CN write match = \"cn\"",
        ),
        (
            "identity = \"ops-admin.example.com:443\"\n",
            "has no \"//\": for a subject CN write match = \"cn\"",
        ),
        (
            "identity = \"1ops.example.com:443\"\n",
            "(taken as a DNS SAN: it has no URI scheme): no DNS name",
        ),
        (
            "identity = \"SPIFFE://mgmt/ns/capi-system/sa/capi-manager\"\n",
            "write the scheme in lower case (spiffe:...)",
        ),
        (
            "identity = \"spiffe://mgmt/capi \"\n",
            "leading or trailing white space",
        ),
    ] {
        let e = inplace_agent::config::Config::parse(
            &format!("[[api.tcp.clients]]\n{entry}role = \"admin\"\n"),
            "config.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(want), "{entry}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "extension.toml",
        "[server]\nlisten = \"127.0.0.1:9443\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
         [[server.clients]]\nidentity = \"capi\"\nmatch = \"uri\"\n\
         [agent]\nca = \"a\"\ncert = \"c\"\nkey = \"k\"\n[resolver]\ntemplate = \"{name}:7443\"\n",
    );
    let e = inplace_extension::config::Config::load(std::path::Path::new(&cfg))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("server.clients[0]: match = \"uri\" but \"capi\" is no URI"),
        "{e}"
    );
}

/// Count limits are checked on the raw message: a million tiny files are refused with
/// INVALID_ARGUMENT naming policy.max_files before anything is decoded, so the daemon's
/// peak memory stays small; an over-size message is RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_checked_before_decoding() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[policy]\nmax_spec_bytes = 16777216\n").unwrap();
    node.start();
    let pid = node.pid().unwrap();
    let mut c = node.client().await;
    let files = vec![
        pb::File {
            path: "/a".into(),
            ..Default::default()
        };
        1_000_000
    ];
    let e = c
        .get_coverage(pb::GetCoverageRequest {
            diff: None,
            desired: Some(pb::NodeSpec {
                files,
                ..Default::default()
            }),
            reboot_policy: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .starts_with("desired.files: 1000000 files, over the limit of 1000 (policy.max_files)"),
        "{}",
        e.message()
    );
    // a million empty KubeletConfiguration values
    let values = pbjson_types::Value {
        kind: Some(pbjson_types::value::Kind::ListValue(
            pbjson_types::ListValue {
                values: vec![pbjson_types::Value::default(); 1_000_000],
            },
        )),
    };
    let e = c
        .apply(pb::ApplyRequest {
            desired: Some(pb::NodeSpec {
                kubelet: Some(pb::Kubelet {
                    config: Some(pbjson_types::Struct {
                        fields: [("featureGates".to_string(), values)].into(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            operation_id: "bomb".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("(policy.max_spec_elements)"),
        "{}",
        e.message()
    );
    // decoded, the million files alone would take hundreds of MB
    let peak = peak_rss(pid);
    eprintln!(
        "measured: agent peak RSS after the refused floods {} MiB",
        peak >> 20
    );
    assert!(peak < 96 << 20, "peak RSS {} MiB", peak >> 20);
    // over the message size: RESOURCE_EXHAUSTED, not OUT_OF_RANGE
    let e = c
        .get_coverage(pb::GetCoverageRequest {
            diff: None,
            desired: Some(pb::NodeSpec {
                files: vec![pb::File {
                    path: "/etc/big".into(),
                    content: vec![b'x'; 18 << 20],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            reboot_policy: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(node.operations().await.is_empty());
}

/// Opens up to `n` plain TCP connections to `addr`, held open while the result lives.
/// A refused or timed-out connect is retried after 50 ms (the server may be slow to accept
/// under load) until 15 s have passed: bounded in count and time.
fn flood(addr: &str, n: usize) -> Vec<TcpStream> {
    let addr = addr.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut held = Vec::new();
    while held.len() < n && Instant::now() < deadline {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => held.push(s),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    held
}

/// With the descriptor table full, the accept loop backs off (no spinning core, a
/// handful of log lines) and the agent still serves once the flood ends; under the
/// connection cap, root's local socket is served during the flood.
#[test]
fn descriptor_exhaustion_neither_spins_nor_locks_root_out() {
    // a cap above the descriptor limit: accept(2) meets EMFILE
    let mut node = Node::new("ubuntu-2404-grub");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    std::fs::write(
        &node.config,
        format!(
            "[api.tcp]\nlisten = \"{addr}\"\ninsecure_loopback = true\nmax_connections = 4096\n"
        ),
    )
    .unwrap();
    node.nofile = Some(200);
    node.log_file = Some(node.dir.path().join("agent.log"));
    node.start();
    let pid = node.pid().unwrap();
    let held = flood(&addr, 400);
    assert!(held.len() >= 200, "{} connections", held.len());
    // and a local client waiting in the Unix socket's backlog: with the table full its
    // accept(2) fails at once too (this spun a core, 2.98 s of CPU in 3 s, when the
    // socket's accept loop had no back-off; seen in CI under load, when a client of the
    // socket happened to connect during the window)
    let local = std::os::unix::net::UnixStream::connect(&node.socket).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let cpu0 = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(3));
    let busy = cpu_seconds(pid) - cpu0;
    eprintln!(
        "measured: {} connections held, {busy:.2} s CPU in 3 s with the descriptor table full",
        held.len()
    );
    assert!(
        busy < 0.75,
        "{busy:.2} s of CPU in 3 s while the table is full"
    );
    let lines = node
        .log()
        .lines()
        .filter(|l| l.contains("accepting a connection failed"))
        .count();
    assert!(
        (2..=6).contains(&lines),
        "{lines} accept-error log lines (TCP and socket)"
    );
    drop(held);
    drop(local);
    std::thread::sleep(Duration::from_millis(1500));
    let out = node.ctl(&["status"]);
    assert!(out.status.success(), "{}", common::err(&out));
    node.stop();

    // the default cap (64) keeps descriptors in reserve: root is served mid-flood
    let mut node = Node::new("ubuntu-2404-grub");
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &node.config,
        format!("[api.tcp]\nlisten = \"{addr}\"\ninsecure_loopback = true\n"),
    )
    .unwrap();
    node.nofile = Some(200);
    node.start();
    let held = flood(&addr, 300);
    // the cap (64) is taken and the listen backlog is full (or the host refuses more)
    assert!(held.len() > 128, "{} connections", held.len());
    let out = node.ctl(&["status"]);
    assert!(out.status.success(), "{}", common::err(&out));
    drop(held);
    node.stop();
}

/// Half-open connections (no TLS handshake) are dropped after the handshake timeout and
/// never keep CAPI out for longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_do_not_lock_capi_out() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let held = flood(&ext.addr, 150);
    assert!(held.len() >= 100);
    let disco = json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"});
    let t = Instant::now();
    let (status, _) = tokio::time::timeout(Duration::from_secs(45), ext.post(DISCOVERY, &disco))
        .await
        .expect("CAPI is answered once the half-open connections time out");
    assert_eq!(status, 200);
    eprintln!(
        "measured: CAPI answered after {:?} behind {} half-open connections",
        t.elapsed(),
        held.len()
    );
    // two rounds of the 10 s handshake timeout free places for 150 connections
    assert!(t.elapsed() < Duration::from_secs(35), "{:?}", t.elapsed());
    // the half-open ones were closed by the extension
    let mut b = [0u8; 1];
    let mut s = held.into_iter().next().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    assert_eq!(s.read(&mut b).unwrap_or(0), 0);
}

/// Eight concurrent 16 MiB bodies of empty objects are refused before they are parsed,
/// and the extension's memory stays bounded (it took 2 GB before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_requests_stay_bounded() {
    let pki = Pki::new();
    let ext = Arc::new(Extension::start(&pki, &[], ""));
    let pid = ext.child.id();
    let mut body = b"[".to_vec();
    while body.len() < (16 << 20) - 16 {
        body.extend_from_slice(b"{},");
    }
    body.extend_from_slice(b"{}]");
    let body = Arc::new(body);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (ext, body) = (ext.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            ext.post_bytes(ext.client.as_ref(), UPDATE, body.to_vec())
                .await
        }));
    }
    for t in tasks {
        let (status, v) = t.await.unwrap().unwrap();
        assert_eq!(status, 413, "{v}");
        assert_eq!(
            v["message"],
            "request refused: more than 100000 JSON values (the extension's limit per request)"
        );
    }
    let peak = peak_rss(pid);
    eprintln!(
        "measured: extension peak RSS after 8 x 16 MiB bodies {} MiB",
        peak >> 20
    );
    assert!(peak < 160 << 20, "peak RSS {} MiB", peak >> 20);
}

/// A declared body over the 16 MiB limit is refused from its head, before a byte of it is
/// sent (it used to wait for the 30 s body timeout, holding a request's place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_content_length_is_refused_unread() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let head = format!(
        "POST {UPDATE} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        (16 << 20) + 1
    );
    let raw = [common::capi::RAW, head.as_bytes()].concat();
    let (status, answer) = ext
        .post_bytes(ext.client.as_ref(), UPDATE, raw)
        .await
        .unwrap();
    assert_eq!(status, 413, "{answer}");
}

/// A connection to the local socket that never sends a byte is closed after the agent's
/// deadline (5 s, `UNIX_FIRST_BYTES_TIMEOUT`); it was held until the client went away, and
/// enough of them used up the agent's descriptors. Clients meanwhile are served.
#[test]
fn a_silent_local_connection_is_closed() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let silent: Vec<std::os::unix::net::UnixStream> = (0..20)
        .map(|_| std::os::unix::net::UnixStream::connect(&node.socket).unwrap())
        .collect();
    let out = node.ctl(&["status"]);
    assert!(
        out.status.success(),
        "served meanwhile: {}",
        common::err(&out)
    );
    let t = Instant::now();
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut b = [0u8; 1];
        let n = s
            .read(&mut b)
            .expect("closed by the agent, not timed out here");
        assert_eq!(n, 0, "the agent sent nothing and closed");
    }
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(12),
        "closed after {waited:?}"
    );
    let out = node.ctl(&["status"]);
    assert!(out.status.success(), "{}", common::err(&out));
}
