//! Prometheus metrics of `inplace-extension` (OpenMetrics text on `[metrics] listen`,
//! plain HTTP on its own port: they carry no secret, only counts):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `inplace_extension_hook_calls_total` | counter | `hook` (`CanUpdateMachine`, `CanUpdateMachineSet`, `UpdateMachine`, `Discovery`), `answer` (`covered`, `not_covered`, `preserve`, `nothing`, `in_progress`, `done`, `failure`) |
//! | `inplace_extension_hook_duration_seconds` | histogram | `hook` |
//! | `inplace_extension_agent_calls_total` | counter | `result` (`ok`, or the gRPC code in snake case, `deadline_exceeded` for no answer in time) |
//! | `inplace_extension_agent_rpcs_total` | counter | `hook`, `rpc` (the agent RPC: `inspect`, `get_coverage`, `apply`, ...; one per call made while answering that hook) |
//! | `inplace_extension_deadline_misses_total` | counter | `hook` (the hook's deadline passed; it answered the fallback) |
//! | `inplace_extension_tls_handshakes_refused_total` | counter | `reason` (connections dropped before they were served; every reason exported at 0, [`inplace_edge::refusals::Reason`]) |
//! | `inplace_extension_build_info` | gauge (1) | `version` |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_start_time_seconds` | counter, gauges | | the process, read from `/proc/self` at each scrape (the names and meanings of client_golang's process collector) |
//!
//! Known label values are exported at 0 from the start ([`ExtensionMetrics::export_at_zero`]:
//! `hook_calls_total{answer="failure"}` and `deadline_misses_total` for every hook), so the
//! first failure after a start is an increase from 0 that `increase()` and `rate()` see.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The extension's metrics.
#[derive(Debug)]
pub(crate) struct ExtensionMetrics {
    registry: Registry,
    hooks: Family<Labels, Counter>,
    latency: Family<Labels, Histogram>,
    agent_calls: Family<Labels, Counter>,
    agent_rpcs: Family<Labels, Counter>,
    deadline_misses: Family<Labels, Counter>,
}

fn hist() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

static METRICS: OnceLock<ExtensionMetrics> = OnceLock::new();

/// The process's metrics (created on first use).
pub(crate) fn get() -> &'static ExtensionMetrics {
    METRICS.get_or_init(ExtensionMetrics::new)
}

impl ExtensionMetrics {
    fn new() -> ExtensionMetrics {
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("inplace_extension");
        let build = Family::<Labels, Gauge>::default();
        build
            .get_or_create(&vec![("version".into(), env!("CARGO_PKG_VERSION").into())])
            .set(1);
        registry.register("build_info", "What runs", build);
        let hooks = Family::<Labels, Counter>::default();
        let latency = Family::<Labels, Histogram>::new_with_constructor(hist as fn() -> Histogram);
        let agent_calls = Family::<Labels, Counter>::default();
        let deadline_misses = Family::<Labels, Counter>::default();
        let agent_rpcs = Family::<Labels, Counter>::default();
        registry.register("hook_calls", "Hook calls by hook and answer", hooks.clone());
        registry.register(
            "hook_duration_seconds",
            "Hook call latency",
            latency.clone(),
        );
        registry.register(
            "agent_calls",
            "Calls to node agents by result",
            agent_calls.clone(),
        );
        registry.register(
            "agent_rpcs",
            "Calls to node agents by hook and RPC",
            agent_rpcs.clone(),
        );
        registry.register(
            "deadline_misses",
            "Hook calls that reached their deadline",
            deadline_misses.clone(),
        );
        registry.register(
            "tls_handshakes_refused",
            "Connections dropped before they were served, by reason",
            inplace_edge::refusals::get().family(),
        );
        ExtensionMetrics {
            registry: root,
            hooks,
            latency,
            agent_calls,
            agent_rpcs,
            deadline_misses,
        }
    }

    /// Exports the series alerts take `increase()` or `rate()` of at 0 for each of
    /// `hooks` (their metric labels): `hook_calls_total{hook, answer="failure"}` and
    /// `deadline_misses_total{hook}`. Called once the metrics are served.
    pub(crate) fn export_at_zero<'a>(&self, hooks: impl IntoIterator<Item = &'a str>) {
        for hook in hooks {
            let _created = self.hooks.get_or_create(&vec![
                ("hook".into(), hook.into()),
                ("answer".into(), "failure".into()),
            ]);
            let _created = self
                .deadline_misses
                .get_or_create(&vec![("hook".into(), hook.into())]);
        }
    }

    /// Records one answered hook call: `hook` is the hook's name, `answer` what it
    /// answered (the labels of the module's table; the hooks decide both).
    pub(crate) fn hook(&self, hook: &str, answer: &str, seconds: f64) {
        self.hooks
            .get_or_create(&vec![
                ("hook".into(), hook.into()),
                ("answer".into(), answer.into()),
            ])
            .inc();
        self.latency
            .get_or_create(&vec![("hook".into(), hook.into())])
            .observe(seconds);
    }

    /// Records a hook whose deadline passed.
    pub(crate) fn deadline_missed(&self, hook: &str) {
        self.deadline_misses
            .get_or_create(&vec![("hook".into(), hook.into())])
            .inc();
    }

    /// Records one agent call's result (`ok` or a gRPC code).
    pub(crate) fn agent_call(&self, result: Result<(), tonic::Code>) {
        let r = match result {
            Ok(()) => "ok".to_string(),
            Err(c) => format!("{c:?}")
                .chars()
                .enumerate()
                .flat_map(|(i, ch)| {
                    let sep = (i > 0 && ch.is_uppercase()).then_some('_');
                    sep.into_iter().chain(ch.to_lowercase())
                })
                .collect(),
        };
        self.agent_calls
            .get_or_create(&vec![("result".into(), r)])
            .inc();
    }

    /// Records one agent RPC `rpc` made while answering `hook`.
    pub(crate) fn agent_rpc(&self, hook: &str, rpc: &str) {
        self.agent_rpcs
            .get_or_create(&vec![
                ("hook".into(), hook.into()),
                ("rpc".into(), rpc.into()),
            ])
            .inc();
    }

    /// The OpenMetrics text.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The process metrics of client_golang's process collector, read from `/proc/self` at
/// each scrape (nothing is exported when it can not be read).
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self` says about this process.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: f64,
    open_fds: i64,
    max_fds: i64,
}

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, fixed at 100 in the Linux
/// ABI; proc(5)).
const USER_HZ: f64 = 100.0;

/// Parses `/proc/self/stat` (fields after the parenthesised command: utime 14, stime 15,
/// starttime 22 in clock ticks, vsize 23 in bytes, rss 24 in pages of `page_size`) and
/// `btime` (boot time, Unix seconds, from `/proc/stat`). None when malformed.
fn parse_stat(stat: &str, btime: f64, page_size: i64) -> Option<ProcessStats> {
    let after = &stat[stat.rfind(')')? + 2..];
    // field 3 (state) is the first after the command
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    Some(ProcessStats {
        cpu_seconds: (num(14)? + num(15)?) / USER_HZ,
        start_time_seconds: btime + num(22)? / USER_HZ,
        virtual_bytes: num(23)? as i64,
        resident_bytes: num(24)? as i64 * page_size,
        ..ProcessStats::default()
    })
}

/// The soft limit of "Max open files" in `/proc/self/limits` (-1 for unlimited).
fn parse_max_fds(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    Some(soft.parse().unwrap_or(-1))
}

fn read_process() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
    // the page size: VmRSS (kB) of /proc/self/status over rss (pages) would be racy; x86_64
    // and aarch64 Linux kernels as built by the distributions use 4 KiB pages
    let mut p = parse_stat(&stat, btime, 4096)?;
    p.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    p.max_fds = parse_max_fds(&std::fs::read_to_string("/proc/self/limits").ok()?)?;
    Some(p)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = read_process() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, f64); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes as f64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                p.max_fds as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                p.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named() {
        let m = ExtensionMetrics::new();
        m.agent_call(Err(tonic::Code::DeadlineExceeded));
        m.hook("CanUpdateMachine", "covered", 0.01);
        let text = m.encode();
        assert!(
            text.contains("inplace_extension_agent_calls_total{result=\"deadline_exceeded\"} 1")
        );
        assert!(text.contains(
            "inplace_extension_hook_calls_total{hook=\"CanUpdateMachine\",answer=\"covered\"} 1"
        ));
    }

    #[test]
    fn failures_and_deadline_misses_start_at_zero() {
        let m = ExtensionMetrics::new();
        m.export_at_zero(["CanUpdateMachine", "UpdateMachine"]);
        let text = m.encode();
        for line in [
            "inplace_extension_hook_calls_total{hook=\"UpdateMachine\",answer=\"failure\"} 0\n",
            "inplace_extension_deadline_misses_total{hook=\"CanUpdateMachine\"} 0\n",
            "inplace_extension_build_info{version=\"0.1.0\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        m.deadline_missed("CanUpdateMachine");
        assert!(
            m.encode()
                .contains("inplace_extension_deadline_misses_total{hook=\"CanUpdateMachine\"} 1\n")
        );
    }

    #[test]
    fn process_metrics_are_read_and_unprefixed() {
        let text = ExtensionMetrics::new().encode();
        assert!(
            text.contains("# TYPE process_cpu_seconds counter\n"),
            "{text}"
        );
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse::<f64>().ok());
        assert!(rss.is_some_and(|b| b > 1e6), "{text}");
    }

    #[test]
    fn proc_stat_fields() {
        // proc(5): a command with a space and a parenthesis, utime 250, stime 50 ticks,
        // starttime 1000 ticks after boot, vsize 8192 bytes, rss 3 pages
        let stat = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1000 8192 3 18446744073709551615";
        let p = parse_stat(stat, 1_700_000_000.0, 4096).unwrap();
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!(p.start_time_seconds, 1_700_000_010.0);
        assert_eq!(p.virtual_bytes, 8192);
        assert_eq!(p.resident_bytes, 3 * 4096);
        assert_eq!(parse_stat("42 (a", 0.0, 4096), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            Some(-1)
        );
    }
}
