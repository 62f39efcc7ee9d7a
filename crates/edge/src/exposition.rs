//! The two text formats of Prometheus metrics, for both binaries' `/metrics` and the
//! agent's node_exporter textfile.
//!
//! `prometheus-client` writes OpenMetrics 1.0 only: a counter's family is named without
//! `_total` (`# TYPE x counter`, samples `x_total`), `# UNIT` lines, `# EOF` last.
//! node_exporter's textfile collector and `promtool check metrics` read the Prometheus
//! text format 0.0.4 (`expfmt.TextParser`), where the family's name is the sample's
//! (`# TYPE x_total counter`), and report the OpenMetrics text as a family without help
//! text or samples. Prometheus itself asks for OpenMetrics first in its `Accept` header
//! and takes either. Source: the OpenMetrics specification
//! (<https://github.com/prometheus/OpenMetrics/blob/main/specification/OpenMetrics.md>,
//! "Counter") and the text format (<https://prometheus.io/docs/instrumenting/exposition_formats/>).

/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the Prometheus text format 0.0.4.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body and `Content-Type` to answer a scrape whose `Accept` header is `accept`:
/// OpenMetrics when the scraper names `application/openmetrics-text` (Prometheus does),
/// else the text format 0.0.4 (curl, promtool, older scrapers), as client_golang
/// negotiates.
pub fn negotiate(openmetrics: String, accept: Option<&str>) -> (String, &'static str) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (openmetrics, OPENMETRICS)
    } else {
        (text_format(&openmetrics), TEXT_FORMAT)
    }
}

/// The Prometheus text format 0.0.4 of an OpenMetrics exposition as `prometheus-client`
/// writes it: `# HELP`/`# TYPE` of a counter family `x` renamed `x_total`, `# UNIT` and
/// `# EOF` dropped; samples, histograms and gauges unchanged. (No exemplars, `_created`
/// or info families are written by either binary.)
pub fn text_format(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 64);
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP a_calls Calls.\n# TYPE a_calls counter\na_calls_total{x=\"y\"} 1\n\
        # HELP a_seconds Latency.\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\n\
        a_seconds_sum 0.5\na_seconds_count 1\na_seconds_bucket{le=\"+Inf\"} 1\n\
        # HELP a_items Items.\n# TYPE a_items gauge\na_items 3\n# EOF\n";

    #[test]
    fn counters_are_named_as_their_samples_and_openmetrics_lines_dropped() {
        assert_eq!(
            text_format(OM),
            "# HELP a_calls_total Calls.\n# TYPE a_calls_total counter\na_calls_total{x=\"y\"} 1\n\
             # HELP a_seconds Latency.\n# TYPE a_seconds histogram\n\
             a_seconds_sum 0.5\na_seconds_count 1\na_seconds_bucket{le=\"+Inf\"} 1\n\
             # HELP a_items Items.\n# TYPE a_items gauge\na_items 3\n"
        );
    }

    #[test]
    fn prometheus_gets_openmetrics_others_the_text_format() {
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(OM.into(), Some(prom)), (OM.into(), OPENMETRICS));
        let (body, ct) = negotiate(OM.into(), Some("*/*"));
        assert_eq!(ct, TEXT_FORMAT);
        assert!(!body.contains("# EOF"), "{body}");
        assert_eq!(negotiate(OM.into(), None).1, TEXT_FORMAT);
    }
}
