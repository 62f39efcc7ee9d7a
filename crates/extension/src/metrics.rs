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

use std::sync::OnceLock;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
        let mut registry = Registry::with_prefix("inplace_extension");
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
            registry,
            hooks,
            latency,
            agent_calls,
            agent_rpcs,
            deadline_misses,
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
}
