//! Human-readable tables for `inplacectl`.

use std::fmt::Write;

use crate::pb::{self, ChangeOperation, DisruptionLevel, Phase};

/// `PHASE_SUCCEEDED` → `Succeeded`.
pub fn phase(p: i32) -> String {
    let name = Phase::try_from(p)
        .unwrap_or(Phase::Unspecified)
        .as_str_name();
    title(name.trim_start_matches("PHASE_"))
}

fn title(s: &str) -> String {
    s.split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_uppercase().collect::<String>() + &c.as_str().to_lowercase(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("")
}

/// `restart kubelet.service`, `reboot`, `none`.
pub fn disruption(d: Option<&pb::Disruption>) -> String {
    let Some(d) = d else { return "none".into() };
    let level = DisruptionLevel::try_from(d.level).unwrap_or(DisruptionLevel::Unspecified);
    let name = level
        .as_str_name()
        .trim_start_matches("DISRUPTION_LEVEL_")
        .to_lowercase()
        .replace('_', "-");
    if d.units.is_empty() {
        name
    } else {
        format!("{name} {}", d.units.join(","))
    }
}

fn operation_name(o: i32) -> String {
    ChangeOperation::try_from(o)
        .unwrap_or(ChangeOperation::Unspecified)
        .as_str_name()
        .trim_start_matches("CHANGE_OPERATION_")
        .to_lowercase()
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Table of changes.
pub fn changes(changes: &[pb::Change]) -> String {
    let mut out = String::new();
    if changes.is_empty() {
        out.push_str("no changes: the node already matches the spec\n");
        return out;
    }
    let w = changes.iter().map(|c| c.id.len()).max().unwrap_or(6).max(6);
    let dw = changes
        .iter()
        .map(|c| disruption(c.disruption.as_ref()).len())
        .max()
        .unwrap_or(10)
        .max(10);
    let _ = writeln!(
        out,
        "{:<w$}  {:<9}  {:<7}  {:<dw$}  REASON",
        "CHANGE", "OPERATION", "COVERED", "DISRUPTION"
    );
    for c in changes {
        let _ = writeln!(
            out,
            "{:<w$}  {:<9}  {:<7}  {:<dw$}  {}",
            c.id,
            operation_name(c.operation),
            yes(c.covered),
            disruption(c.disruption.as_ref()),
            c.reason
        );
    }
    out
}

/// Node facts in one line plus evidence.
pub fn facts(f: &pb::NodeFacts, p: Option<&pb::Preservation>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node:            {} ({} {}){}",
        f.platform,
        f.vendor,
        f.product,
        if f.hypervisor.is_empty() {
            String::new()
        } else {
            format!(", hypervisor {}", f.hypervisor)
        }
    );
    if !f.os.is_empty() {
        let _ = writeln!(out, "os:              {}", f.os);
    }
    let _ = writeln!(out, "kernel args:     {}", f.kernel_args_backend);
    if f.memory_bytes > 0 {
        let _ = writeln!(out, "memory:          {} MiB", f.memory_bytes / (1 << 20));
    }
    if let Some(p) = p {
        let _ = writeln!(
            out,
            "preserve:        {}{}",
            yes(p.preserve),
            if p.reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.reasons.join("; "))
            }
        );
    }
    out
}

/// A coverage report.
pub fn coverage(r: &pb::CoverageReport) -> String {
    let mut out = changes(&r.changes);
    out.push('\n');
    let _ = writeln!(out, "fully covered:   {}", yes(r.fully_covered));
    let _ = writeln!(
        out,
        "max disruption:  {}",
        disruption(r.max_disruption.as_ref())
    );
    let _ = writeln!(out, "reboot required: {}", yes(r.reboot_required));
    if let Some(f) = &r.facts {
        out.push_str(&facts(f, r.preservation.as_ref()));
    }
    let _ = writeln!(out, "spec:            {}", r.spec_hash);
    out
}

/// One operation.
pub fn operation(op: &pb::Operation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "operation:       {}", op.id);
    let _ = writeln!(
        out,
        "phase:           {}{}",
        phase(op.phase),
        if op.dry_run { " (dry run)" } else { "" }
    );
    let _ = writeln!(out, "message:         {}", op.message);
    let _ = writeln!(out, "spec:            {}", op.spec_hash);
    if !op.changes.is_empty() {
        out.push('\n');
        out.push_str(&changes(&op.changes));
    }
    if !op.actions.is_empty() {
        out.push_str("\nactions:\n");
        for a in &op.actions {
            let _ = writeln!(out, "  - {a}");
        }
    }
    out
}

/// Operation history.
pub fn history(ops: &[pb::Operation]) -> String {
    let mut out = String::new();
    if ops.is_empty() {
        out.push_str("no operations\n");
        return out;
    }
    let w = ops.iter().map(|o| o.id.len()).max().unwrap_or(2).max(2);
    let _ = writeln!(
        out,
        "{:<w$}  {:<20}  {:<16}  {:>7}  MESSAGE",
        "ID", "CREATED", "PHASE", "CHANGES"
    );
    for o in ops {
        let created = o
            .created
            .map(|t| format_time(t.seconds))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<w$}  {:<20}  {:<16}  {:>7}  {}",
            o.id,
            created,
            phase(o.phase),
            o.changes.len(),
            o.message
        );
    }
    out
}

/// Status.
pub fn status(s: &pb::NodeStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent:           inplaced {} (up {}s)",
        s.version, s.agent_uptime_seconds
    );
    let _ = writeln!(out, "root:            {}", s.root);
    let _ = writeln!(
        out,
        "boot id:         {}",
        if s.boot_id.is_empty() {
            "unknown"
        } else {
            &s.boot_id
        }
    );
    if let Some(f) = &s.facts {
        out.push_str(&facts(f, s.preservation.as_ref()));
    }
    let _ = writeln!(
        out,
        "applied spec:    {}",
        if s.applied_spec_hash.is_empty() {
            "none"
        } else {
            &s.applied_spec_hash
        }
    );
    let _ = writeln!(out, "managed items:   {}", s.managed_items);
    if !s.kubernetes_version.is_empty() {
        let _ = writeln!(out, "kubernetes:      {}", s.kubernetes_version);
    }
    match &s.current_operation {
        Some(op) => {
            let _ = writeln!(
                out,
                "operation:       {} {} ({})",
                op.id,
                phase(op.phase),
                op.message
            );
        }
        None => {
            let _ = writeln!(out, "operation:       idle");
        }
    }
    if !s.pending_reboot_operation.is_empty() {
        let _ = writeln!(out, "pending reboot:  {}", s.pending_reboot_operation);
    }
    for p in &s.problems {
        let _ = writeln!(out, "problem:         {p}");
    }
    if s.drift.is_empty() {
        let _ = writeln!(out, "drift:           none");
    } else {
        let _ = writeln!(out, "drift:");
        for d in &s.drift {
            let _ = writeln!(
                out,
                "  - {}: expected {}, observed {}",
                d.id, d.expected, d.observed
            );
        }
    }
    out
}

/// Unix seconds → `YYYY-MM-DDTHH:MM:SSZ` (UTC, proleptic Gregorian; Howard Hinnant's
/// days-from-civil inverse).
pub fn format_time(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The error and its causes, one per line, without a backtrace; a gRPC status prints its
/// code and message.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = if let Some(s) = cause.downcast_ref::<tonic::Status>() {
            format!("{:?}: {}", s.code(), s.message())
        } else {
            cause.to_string()
        };
        // libraries often repeat their cause in their own message
        if parts.last().is_some_and(|p| p.ends_with(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_format() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(1_798_502_400), "2026-12-29T00:00:00Z");
    }

    #[test]
    fn phase_names() {
        assert_eq!(phase(Phase::RebootRequired as i32), "RebootRequired");
    }
}
