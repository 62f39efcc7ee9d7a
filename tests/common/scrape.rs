//! Prometheus scrapes of a daemon's metrics listener over loopback HTTP.

use std::io::{Read, Write};

/// Prometheus's `Accept` header (scrape.go, `scrapeAcceptHeader` with OpenMetrics on).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// GET /metrics as Prometheus asks (OpenMetrics).
pub(crate) fn scrape(addr: &str) -> (String, String) {
    scrape_accepting(addr, PROMETHEUS_ACCEPT)
}

/// GET /metrics with `accept` as the `Accept` header.
pub(crate) fn scrape_accepting(addr: &str, accept: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: {accept}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// The value of the sample `line` starts with (`name{labels}`), if present.
pub(crate) fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
