//! `kubelet-standin`: installed as `/usr/bin/kubelet` in the VM test image and started by
//! kubeadm's real unit layout (`kubelet.service` + `10-kubeadm.conf`). It checks what a
//! kubelet checks first and fails the way the kubelet does (exit 1 with pflag's message):
//!
//! - `--version` alone prints `Kubernetes v1.34.2` and exits 0, as the kubelet does (the
//!   agent reads the node's version from it);
//! - flags: `--name=value` or `--name value`; an unknown flag, or a `--max-pods` /
//!   `--v` that is not an integer, is refused;
//! - `--config`: must exist and be a `kubelet.config.k8s.io/v1beta1`
//!   `KubeletConfiguration`; `healthzBindAddress`, `healthzPort` and `maxPods` (top-level
//!   scalars) are read, `maxPods` must be an integer.
//!
//! Then it writes its arguments to `/run/kubelet-standin/args` (one a line) and the
//! effective values to `/run/kubelet-standin/effective`, logs them, and serves HTTP on
//! the healthz address: `/healthz` (`ok`), `/args`, `/effective`.
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

const KNOWN: &[&str] = &[
    "bootstrap-kubeconfig",
    "kubeconfig",
    "config",
    "container-runtime-endpoint",
    "pod-infra-container-image",
    "node-ip",
    "node-labels",
    "hostname-override",
    "provider-id",
    "max-pods",
    "register-with-taints",
    "cgroup-driver",
    "v",
    "cloud-provider",
    "rotate-server-certificates",
    "feature-gates",
];
const INTEGER: &[&str] = &["max-pods", "v"];

fn fail(msg: String) -> ExitCode {
    eprintln!("E kubelet-standin: {msg}");
    eprintln!("Error: {msg}");
    ExitCode::from(1)
}

/// The version `--version` reports, as the kubelet prints it (`Kubernetes v1.34.2`,
/// k8s.io/component-base/version/verflag): the release the image's kubeadm layout and the
/// CAPI fixtures' Machines (`spec.version`) name.
const VERSION: &str = "v1.34.2";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv == ["--version"] {
        println!("Kubernetes {VERSION}");
        return ExitCode::SUCCESS;
    }
    let mut flags = BTreeMap::new();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let Some(body) = a.strip_prefix("--") else {
            return fail(format!("unexpected argument {a:?}"));
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => match it.next() {
                Some(v) => (body.to_string(), v.clone()),
                None => return fail(format!("flag needs an argument: --{body}")),
            },
        };
        if !KNOWN.contains(&name.as_str()) {
            return fail(format!("unknown flag: --{name}"));
        }
        if INTEGER.contains(&name.as_str()) && value.parse::<i32>().is_err() {
            return fail(format!(
                "invalid argument {value:?} for \"--{name}\" flag: strconv.ParseInt: parsing {value:?}: invalid syntax"
            ));
        }
        flags.insert(name, value);
    }
    let Some(config) = flags.get("config") else {
        return fail("no --config given".into());
    };
    let text = match std::fs::read_to_string(config) {
        Ok(t) => t,
        Err(e) => return fail(format!("failed to load kubelet config file {config}: {e}")),
    };
    let mut top = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with([' ', '\t', '#', '-']) || line.trim().is_empty() {
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            top.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
        }
    }
    if top.get("kind").map(String::as_str) != Some("KubeletConfiguration")
        || top.get("apiVersion").map(String::as_str) != Some("kubelet.config.k8s.io/v1beta1")
    {
        return fail(format!(
            "{config}: not a kubelet.config.k8s.io/v1beta1 KubeletConfiguration"
        ));
    }
    if let Some(m) = top.get("maxPods") {
        if m.parse::<i32>().is_err() {
            return fail(format!("{config}: maxPods: {m:?} is not an integer"));
        }
    }
    let addr = top
        .get("healthzBindAddress")
        .cloned()
        .unwrap_or("127.0.0.1".into());
    let port = top.get("healthzPort").cloned().unwrap_or("10248".into());
    let max_pods = flags
        .get("max-pods")
        .or(top.get("maxPods"))
        .cloned()
        .unwrap_or("110".into());

    let args_text: String = argv.iter().map(|a| format!("{a}\n")).collect();
    let effective = format!(
        "max-pods={max_pods}\nhealthz={addr}:{port}\npid={}\n",
        std::process::id()
    );
    let _ = std::fs::create_dir_all("/run/kubelet-standin");
    let _ = std::fs::write("/run/kubelet-standin/args", &args_text);
    let _ = std::fs::write("/run/kubelet-standin/effective", &effective);
    eprintln!("I kubelet-standin: started with {}", argv.join(" "));
    eprintln!(
        "I kubelet-standin: effective {}",
        effective.replace('\n', " ")
    );

    let listener = match TcpListener::bind(format!("{addr}:{port}")) {
        Ok(l) => l,
        Err(e) => return fail(format!("listen {addr}:{port}: {e}")),
    };
    for stream in listener.incoming() {
        let Ok(s) = stream else { continue };
        serve_one(s, &args_text, &effective);
    }
    ExitCode::SUCCESS
}

/// Answers one HTTP/1.x request the way Go's `net/http` server does at the boundary a
/// client sees: the whole request head is read (up to the blank line, 8 KiB, 2 s) before
/// answering, the response goes out in one write, and the connection is half-closed and
/// drained before it is dropped. Closing a socket with unread request bytes makes Linux
/// send a RST, which discards a response the client has not read yet (the VM test saw
/// `Connection reset by peer` and a lost body when the request arrived in two segments).
fn serve_one(mut s: TcpStream, args_text: &str, effective: &str) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let req = String::from_utf8_lossy(&head);
    let path = req.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match path {
        "/healthz" => ("200 OK", "ok"),
        "/args" => ("200 OK", args_text),
        "/effective" => ("200 OK", effective),
        _ => ("404 Not Found", "404 page not found\n"),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(response.as_bytes()).is_err() {
        return;
    }
    let _ = s.flush();
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}
