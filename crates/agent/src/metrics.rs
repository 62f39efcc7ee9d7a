//! Prometheus metrics of the agent (the `prometheus-client` crate, OpenMetrics text).
//!
//! Everything a fleet alerts on is derived from the agent's own status and history at
//! collection time ([`NodeMetrics::refresh`]), so the engine carries no metrics code and
//! the numbers can not disagree with `inplacectl status`:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `inplaced_build_info` | gauge (1) | `version`, `kernel_args_backend`, `platform` | what runs where |
//! | `inplaced_operations_total` | counter | `phase` | operations that reached a final phase (`Succeeded`, `Failed`, `RolledBack`, each exported at 0 from the start) since the daemon started |
//! | `inplaced_operation_running` | gauge | `phase` | 1 for the phase of the running operation, none when idle |
//! | `inplaced_last_operation_end_timestamp_seconds` | gauge | | when the newest settled operation ended (Unix seconds) |
//! | `inplaced_last_operation_result` | gauge (1) | `phase` | the newest settled operation's phase |
//! | `inplaced_pending_reboot` | gauge (1) | `operation` | an operation waits for a reboot |
//! | `inplaced_drift_items` | gauge | `section` | managed items that differ from the applied record |
//! | `inplaced_managed_items` | gauge | | items in the applied record |
//! | `inplaced_state_problems` | gauge | | problems found in the agent's own state |
//! | `inplaced_journal_recoveries_total` | counter | | interrupted operations recovered from the journal at start-up |
//! | `inplaced_coverage_duration_seconds` | histogram | | `GetCoverage` latency |
//! | `inplaced_coverage_answers_total` | counter | `answer` | `GetCoverage` answers: `kept` (the node unchanged since the same request was computed), `computed` |
//! | `inplaced_apply_duration_seconds` | histogram | | operation duration, start to final phase |
//! | `inplaced_tls_handshakes_refused_total` | counter | `reason` | TCP connections (API, metrics) dropped before they were served, every reason exported at 0 ([`inplace_edge::refusals::Reason`]) |
//!
//! Counters restart at 0 with the daemon, as Prometheus expects; an operation is counted
//! once, when a refresh first sees it settled (refreshes run at every scrape and every
//! 5 s for the textfile; the history keeps `history.keep` operations, so none is missed
//! unless more than that settle between two refreshes).

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use inplace_wire::pb;

type Labels = Vec<(String, String)>;

/// The agent's metrics and what has been counted so far.
#[derive(Debug)]
pub(crate) struct NodeMetrics {
    registry: Registry,
    build: Family<Labels, Gauge>,
    operations: Family<Labels, Counter>,
    running: Family<Labels, Gauge>,
    last_end: Gauge<f64, std::sync::atomic::AtomicU64>,
    last_result: Family<Labels, Gauge>,
    pending_reboot: Family<Labels, Gauge>,
    drift: Family<Labels, Gauge>,
    managed: Gauge,
    problems: Gauge,
    recoveries: Counter,
    coverage: Histogram,
    coverage_answers: Family<Labels, Counter>,
    apply: Histogram,
    counted: Mutex<BTreeSet<String>>,
    started: i64,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The phase name as `inplacectl` prints it (`Succeeded`, `RolledBack`, ...).
fn phase_label(p: i32) -> String {
    inplace_wire::phase::name(inplace_wire::phase::from_i32(p))
}

/// The NodeSpec section of a change id (`files[/etc/x]` → `files`, `kubelet.flags[x]` →
/// `kubelet`, `kernelArgs` → `kernelArgs`): [`inplace_wire::ids::section_of`].
pub(crate) fn section_of(id: &str) -> &str {
    inplace_wire::ids::section_of(id)
}

/// `inplaced_build_info`: 1, labelled with the agent's version, its kernel-args backend
/// (the name before `:`) and the platform.
fn build_info(facts: &pb::NodeFacts, version: &str) -> Family<Labels, Gauge> {
    let build = Family::<Labels, Gauge>::default();
    let backend = facts
        .kernel_args_backend
        .split(':')
        .next()
        .unwrap_or("")
        .to_string();
    build
        .get_or_create(&labels(&[
            ("version", version),
            ("kernel_args_backend", &backend),
            ("platform", &facts.platform),
        ]))
        .set(1);
    build
}

impl NodeMetrics {
    /// The registry with every metric; `facts` and `version` fill `inplaced_build_info`,
    /// `recoveries` the journals found at start-up.
    pub(crate) fn new(facts: &pb::NodeFacts, version: &str, recoveries: u64) -> NodeMetrics {
        let mut registry = Registry::with_prefix("inplaced");
        let m = NodeMetrics {
            build: build_info(facts, version),
            operations: Family::default(),
            running: Family::default(),
            last_end: Gauge::default(),
            last_result: Family::default(),
            pending_reboot: Family::default(),
            drift: Family::default(),
            managed: Gauge::default(),
            problems: Gauge::default(),
            recoveries: Counter::default(),
            coverage: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            coverage_answers: Family::default(),
            apply: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            counted: Mutex::new(BTreeSet::new()),
            started: now_seconds(),
            registry: Registry::default(),
        };
        m.recoveries.inc_by(recoveries);
        for answer in ["kept", "computed"] {
            let _ = m
                .coverage_answers
                .get_or_create(&labels(&[("answer", answer)]));
        }
        // Every final phase at 0 from the start: a series that first appears at 1 gives
        // `increase()` nothing to compare, and the first rollback after a start would
        // not fire `InplacedOperationRolledBack` (deploy/alerts.yaml).
        for phase in [
            pb::Phase::Succeeded,
            pb::Phase::Failed,
            pb::Phase::RolledBack,
        ] {
            let _created = m
                .operations
                .get_or_create(&labels(&[("phase", &phase_label(phase as i32))]));
        }
        m.register(&mut registry);
        NodeMetrics { registry, ..m }
    }

    /// Registers every metric in `registry`, in the order they are exposed.
    fn register(&self, registry: &mut Registry) {
        registry.register("build_info", "What runs where", self.build.clone());
        registry.register(
            "operations",
            "Operations that reached a final phase since start",
            self.operations.clone(),
        );
        registry.register(
            "operation_running",
            "1 for the phase of the running operation",
            self.running.clone(),
        );
        registry.register(
            "last_operation_end_timestamp_seconds",
            "When the newest settled operation ended",
            self.last_end.clone(),
        );
        registry.register(
            "last_operation_result",
            "Phase of the newest settled operation",
            self.last_result.clone(),
        );
        registry.register(
            "pending_reboot",
            "An operation waits for a reboot",
            self.pending_reboot.clone(),
        );
        registry.register(
            "drift_items",
            "Managed items that differ from the applied record",
            self.drift.clone(),
        );
        registry.register(
            "managed_items",
            "Items in the applied record",
            self.managed.clone(),
        );
        registry.register(
            "state_problems",
            "Problems found in the agent's own state",
            self.problems.clone(),
        );
        registry.register(
            "journal_recoveries",
            "Interrupted operations recovered from the journal at start-up",
            self.recoveries.clone(),
        );
        registry.register(
            "coverage_duration_seconds",
            "GetCoverage latency",
            self.coverage.clone(),
        );
        registry.register(
            "coverage_answers",
            "GetCoverage answers, kept (the node unchanged) or computed",
            self.coverage_answers.clone(),
        );
        registry.register(
            "apply_duration_seconds",
            "Operation duration, start to final phase",
            self.apply.clone(),
        );
        registry.register(
            "tls_handshakes_refused",
            "Connections dropped before they were served, by reason",
            inplace_edge::refusals::get().family(),
        );
    }

    /// Records one coverage call's latency and, when it was answered, whether its answer
    /// was kept (`Some(true)`) or computed.
    pub(crate) fn observe_coverage(&self, seconds: f64, kept: Option<bool>) {
        self.coverage.observe(seconds);
        let Some(kept) = kept else {
            return;
        };
        let answer = if kept { "kept" } else { "computed" };
        self.coverage_answers
            .get_or_create(&labels(&[("answer", answer)]))
            .inc();
    }

    /// Updates every gauge from `status` and counts newly settled operations of `history`
    /// (newest first).
    pub(crate) fn refresh(&self, status: &pb::NodeStatus, history: &[pb::Operation]) {
        self.running.clear();
        if let Some(op) = &status.current_operation {
            self.running
                .get_or_create(&labels(&[("phase", &phase_label(op.phase))]))
                .set(1);
        }
        self.pending_reboot.clear();
        if !status.pending_reboot_operation.is_empty() {
            self.pending_reboot
                .get_or_create(&labels(&[("operation", &status.pending_reboot_operation)]))
                .set(1);
        }
        self.drift.clear();
        for d in &status.drift {
            self.drift
                .get_or_create(&labels(&[("section", section_of(&d.id))]))
                .inc();
        }
        self.managed.set(i64::from(status.managed_items));
        self.problems.set(status.problems.len() as i64);
        let settled: Vec<&pb::Operation> = history
            .iter()
            .filter(|o| inplace_wire::phase::is_terminal(o.phase))
            .collect();
        self.last_result.clear();
        if let Some(last) = settled.first() {
            self.last_result
                .get_or_create(&labels(&[("phase", &phase_label(last.phase))]))
                .set(1);
            if let Some(t) = &last.updated {
                self.last_end
                    .set(t.seconds as f64 + f64::from(t.nanos) / 1e9);
            }
        }
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        for op in settled {
            let ended = op.updated.as_ref().map_or(0, |t| t.seconds);
            if ended < self.started || !counted.insert(op.id.clone()) {
                continue;
            }
            self.operations
                .get_or_create(&labels(&[("phase", &phase_label(op.phase))]))
                .inc();
            if let (Some(a), Some(b)) = (&op.created, &op.updated) {
                let secs = (b.seconds - a.seconds) as f64 + f64::from(b.nanos - a.nanos) / 1e9;
                self.apply.observe(secs.max(0.0));
            }
        }
    }

    /// The OpenMetrics text of every metric.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String does not fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Writes `text` to the node path `path` under the sysroot `root` like every node file
/// ([`inplace_node::sysroot::Sysroot::write_trusted`]: each component opened `O_NOFOLLOW`, a unique
/// `O_EXCL` temporary `.<name>.inplaced-<pid>-<n>.tmp` in the same directory, fsync,
/// rename), mode 0644 as node_exporter's textfile collector expects (it reads `*.prom`
/// files only, so the temporary is never half-read). The directory is never created: it
/// and every directory above it must exist and be owned by root (or the agent's uid) and
/// not group- or other-writable, or nothing is written.
///
/// # Errors
/// [`TrustError`] naming the path: missing or untrusted directory, a symlink at `path`,
/// I/O.
pub(crate) fn write_textfile(
    root: &inplace_node::sysroot::Sysroot,
    path: &str,
    text: &str,
) -> Result<(), inplace_node::trust::TrustError> {
    root.write_trusted(path, text.as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_of_change_ids() {
        assert_eq!(section_of("files[/etc/x.conf]"), "files");
        assert_eq!(section_of("kubelet.flags[max-pods]"), "kubelet");
        assert_eq!(section_of("kernelArgs[isolcpus]"), "kernelArgs");
        assert_eq!(section_of("ntp"), "ntp");
    }

    #[test]
    fn settled_operations_are_counted_once() {
        let m = NodeMetrics::new(&pb::NodeFacts::default(), "0.1.0", 2);
        let t = |s| {
            Some(pbjson_types::Timestamp {
                seconds: s,
                nanos: 0,
            })
        };
        let op = pb::Operation {
            id: "a".into(),
            phase: pb::Phase::Succeeded as i32,
            created: t(m.started),
            updated: t(m.started + 3),
            ..Default::default()
        };
        let status = pb::NodeStatus {
            pending_reboot_operation: "b".into(),
            drift: vec![pb::Drift {
                id: "files[/etc/x]".into(),
                ..Default::default()
            }],
            managed_items: 4,
            ..Default::default()
        };
        let fresh = m.encode();
        for phase in ["Succeeded", "Failed", "RolledBack"] {
            let line = format!("inplaced_operations_total{{phase=\"{phase}\"}} 0\n");
            assert!(fresh.contains(&line), "{fresh}");
        }
        m.refresh(&status, std::slice::from_ref(&op));
        m.refresh(&status, std::slice::from_ref(&op));
        let text = m.encode();
        assert!(
            text.contains("inplaced_operations_total{phase=\"Succeeded\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("inplaced_pending_reboot{operation=\"b\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("inplaced_drift_items{section=\"files\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("inplaced_managed_items 4\n"), "{text}");
        assert!(
            text.contains("inplaced_journal_recoveries_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("inplaced_apply_duration_seconds_count 1\n"),
            "{text}"
        );
        // the reboot happened: the label is gone, not left at 1
        m.refresh(&pb::NodeStatus::default(), &[op]);
        assert!(!m.encode().contains("inplaced_pending_reboot{"));
    }
}
