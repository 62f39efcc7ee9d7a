//! Human-readable tables for `inplacectl`.

use std::fmt::Write;

use inplace_edge::logging::{escape_controls as esc, escape_controls_in_lines};
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel, Phase};

/// `PHASE_SUCCEEDED` → `Succeeded`.
pub(crate) fn phase(p: i32) -> String {
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
pub(crate) fn disruption(d: Option<&pb::Disruption>) -> String {
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
        format!("{name} {}", esc(&d.units.join(",")))
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

/// Table of changes, every reason in full.
pub(crate) fn changes(changes: &[pb::Change]) -> String {
    changes_table(changes, |c| c.reason.as_str())
}

/// The id prefix of the kernel-argument changes (`kernelArgs`, `kernelArgs[isolcpus]`).
const KERNEL_ARGS: &str = "kernelArgs";

/// A kernel-argument change's reason without the backend explanation `backend` it starts
/// with (the planner puts the backend's reason first, then `; ` and the rest), or the
/// reason unchanged.
fn short_reason<'a>(c: &'a pb::Change, backend: &str) -> &'a str {
    if backend.is_empty() || !c.id.starts_with(KERNEL_ARGS) {
        return &c.reason;
    }
    match c.reason.strip_prefix(backend) {
        Some(rest) => rest.trim_start_matches([';', ' ']),
        None => &c.reason,
    }
}

/// The table with `reason` for each row's reason column.
fn changes_table<'a>(
    changes: &'a [pb::Change],
    reason: impl Fn(&'a pb::Change) -> &'a str,
) -> String {
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
            esc(&c.id),
            operation_name(c.operation),
            yes(c.covered),
            disruption(c.disruption.as_ref()),
            esc(reason(c))
        );
    }
    out
}

/// Node facts in one line plus evidence.
pub(crate) fn facts(f: &pb::NodeFacts, p: Option<&pb::Preservation>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node:            {} ({} {}){}",
        esc(&f.platform),
        esc(&f.vendor),
        esc(&f.product),
        if f.hypervisor.is_empty() {
            String::new()
        } else {
            format!(", hypervisor {}", esc(&f.hypervisor))
        }
    );
    if !f.os.is_empty() {
        let _ = writeln!(out, "os:              {}", esc(&f.os));
    }
    let _ = writeln!(out, "kernel args:     {}", esc(&f.kernel_args_backend));
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
                format!(" ({})", esc(&p.reasons.join("; ")))
            }
        );
    }
    out
}

/// A coverage report: the kernel-argument backend's explanation once under the table,
/// not in every kernelArgs row (`-o wide` keeps it there, see [`coverage_wide`]).
pub(crate) fn coverage(r: &pb::CoverageReport) -> String {
    let backend = r
        .facts
        .as_ref()
        .map_or("", |f| f.kernel_args_backend.as_str());
    let mut out = changes_table(&r.changes, |c| short_reason(c, backend));
    let shortened = r
        .changes
        .iter()
        .any(|c| short_reason(c, backend).len() < c.reason.len());
    if shortened {
        let _ = writeln!(out, "\n{KERNEL_ARGS} backend: {}", esc(backend));
    }
    out.push_str(&report_summary(r, !shortened));
    out
}

/// A coverage report with every reason in full (`-o wide`).
pub(crate) fn coverage_wide(r: &pb::CoverageReport) -> String {
    let mut out = changes(&r.changes);
    out.push_str(&report_summary(r, true));
    out
}

/// The lines under a report's table: coverage, disruption, facts (the kernel-args
/// backend line only with `backend`), spec hash, diffs.
fn report_summary(r: &pb::CoverageReport, backend: bool) -> String {
    let mut out = String::from("\n");
    let _ = writeln!(out, "fully covered:   {}", yes(r.fully_covered));
    let _ = writeln!(
        out,
        "max disruption:  {}",
        disruption(r.max_disruption.as_ref())
    );
    let _ = writeln!(out, "reboot required: {}", yes(r.reboot_required));
    if let Some(f) = &r.facts {
        let text = facts(f, r.preservation.as_ref());
        for line in text.lines() {
            if backend || !line.starts_with("kernel args:") {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    let _ = writeln!(out, "spec:            {}", esc(&r.spec_hash));
    out.push_str(&diffs(&r.diffs));
    out
}

/// The file diffs of a report or dry run: each file's header line (path, operation, the
/// changes that edit it), then its unified diff, or its hashes and sizes when the content
/// is withheld.
pub(crate) fn diffs(diffs: &[pb::FileDiff]) -> String {
    let mut out = String::new();
    for d in diffs {
        let _ = writeln!(
            out,
            "\ndiff {} ({}; {})",
            esc(&d.path),
            operation_name(d.operation),
            esc(&d.change_ids.join(", "))
        );
        if !d.unified.is_empty() {
            out.push_str(&escape_controls_in_lines(&d.unified));
            if !d.unified.ends_with('\n') {
                out.push('\n');
            }
            continue;
        }
        let side = |sha: &str, size: u64| {
            if sha.is_empty() {
                "absent".to_string()
            } else {
                format!("{} ({size} bytes)", esc(sha))
            }
        };
        if d.after_unknown {
            let _ = writeln!(out, "  {}", esc(&d.withheld));
        } else if !d.withheld.is_empty() {
            let _ = writeln!(out, "  content withheld: {}", esc(&d.withheld));
        } else {
            let _ = writeln!(out, "  content unchanged (mode or owner only)");
        }
        let _ = writeln!(out, "  before: {}", side(&d.before_sha256, d.before_size));
        let after = if d.after_unknown {
            "not known ahead".to_string()
        } else {
            side(&d.after_sha256, d.after_size)
        };
        let _ = writeln!(out, "  after:  {after}");
    }
    out
}

/// One operation.
pub(crate) fn operation(op: &pb::Operation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "operation:       {}", esc(&op.id));
    let _ = writeln!(
        out,
        "phase:           {}{}",
        phase(op.phase),
        if op.dry_run { " (dry run)" } else { "" }
    );
    let _ = writeln!(out, "message:         {}", esc(&op.message));
    let _ = writeln!(out, "spec:            {}", esc(&op.spec_hash));
    if op.try_seconds > 0 {
        let deadline = op
            .try_deadline
            .map(|t| format_time(t.seconds))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "try:             {} s, confirm by {deadline} (inplacectl confirm {})",
            op.try_seconds,
            esc(&op.id)
        );
    }
    if let Some(r) = &op.reboot {
        out.push_str(&reboot(r));
    }
    if !op.changes.is_empty() {
        out.push('\n');
        out.push_str(&changes(&op.changes));
    }
    out.push_str(&diffs(&op.diffs));
    if !op.actions.is_empty() {
        out.push_str("\nactions:\n");
        for a in &op.actions {
            let _ = writeln!(out, "  - {}", esc(a));
        }
    }
    out
}

/// The reboot of an operation: the method that ran, why, and its time once booted.
fn reboot(r: &pb::RebootReport) -> String {
    let method = match pb::RebootMethod::try_from(r.method) {
        Ok(pb::RebootMethod::Kexec) => "kexec",
        Ok(pb::RebootMethod::Full) => "full",
        _ => "unknown",
    };
    let mut out = format!("reboot:          {method} ({})\n", esc(&r.reason));
    if !r.to_boot_id.is_empty() {
        let _ = writeln!(
            out,
            "reboot time:     {:.1} s from the request to the agent's start ({:.1} s of it after the kernel started); boot id {} -> {}",
            r.seconds,
            r.kernel_uptime_seconds,
            esc(&r.from_boot_id),
            esc(&r.to_boot_id)
        );
    }
    if !r.command_line.is_empty() {
        let _ = writeln!(out, "kexec cmdline:   {}", esc(&r.command_line));
    }
    out
}

/// Operation history.
pub(crate) fn history(ops: &[pb::Operation]) -> String {
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
            esc(&o.id),
            created,
            phase(o.phase),
            o.changes.len(),
            row_message(&o.id, &esc(&o.message))
        );
    }
    out
}

/// Characters of an operation's message a `history` row shows: a roll-back's message
/// names every path it restored, which would make one row hundreds of lines wide.
const ROW_MESSAGE_CHARS: usize = 200;

/// `message` (already escaped) cut to [`ROW_MESSAGE_CHARS`] characters, saying where the
/// whole of it is.
fn row_message(id: &str, message: &str) -> String {
    match message.char_indices().nth(ROW_MESSAGE_CHARS) {
        None => message.to_string(),
        Some((at, _)) => format!(
            "{}... ({} more characters: inplacectl get {})",
            &message[..at],
            message[at..].chars().count(),
            esc(id)
        ),
    }
}

/// Status.
pub(crate) fn status(s: &pb::NodeStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent:           inplaced {} (up {}s)",
        esc(&s.version),
        s.agent_uptime_seconds
    );
    let _ = writeln!(out, "root:            {}", esc(&s.root));
    let _ = writeln!(
        out,
        "boot id:         {}",
        if s.boot_id.is_empty() {
            "unknown".into()
        } else {
            esc(&s.boot_id)
        }
    );
    if let Some(f) = &s.facts {
        out.push_str(&facts(f, s.preservation.as_ref()));
    }
    let _ = writeln!(
        out,
        "applied spec:    {}",
        if s.applied_spec_hash.is_empty() {
            "none".into()
        } else {
            esc(&s.applied_spec_hash)
        }
    );
    let _ = writeln!(out, "managed items:   {}", s.managed_items);
    if !s.kubernetes_version.is_empty() {
        let _ = writeln!(out, "kubernetes:      {}", esc(&s.kubernetes_version));
    }
    match &s.current_operation {
        Some(op) => {
            let _ = writeln!(
                out,
                "operation:       {} {} ({})",
                esc(&op.id),
                phase(op.phase),
                esc(&op.message)
            );
        }
        None => {
            let _ = writeln!(out, "operation:       idle");
        }
    }
    if !s.pending_reboot_operation.is_empty() {
        let _ = writeln!(out, "pending reboot:  {}", esc(&s.pending_reboot_operation));
    }
    for p in &s.problems {
        let _ = writeln!(out, "problem:         {}", esc(p));
    }
    if s.drift.is_empty() {
        let _ = writeln!(out, "drift:           none");
    } else {
        let _ = writeln!(out, "drift:");
        for d in &s.drift {
            let _ = writeln!(
                out,
                "  - {}: expected {}, observed {}",
                esc(&d.id),
                esc(&d.expected),
                esc(&d.observed)
            );
        }
    }
    out
}

/// Unix seconds → `YYYY-MM-DDTHH:MM:SSZ` (UTC, proleptic Gregorian; Howard Hinnant's
/// days-from-civil inverse).
pub(crate) fn format_time(secs: i64) -> String {
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
pub(crate) fn error_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = if let Some(s) = cause.downcast_ref::<tonic::Status>() {
            // the agent's spec and request errors read as the client's own (`invalid
            // spec: <field>: <fix>`, as `validate` prints them), not as a gRPC code
            if s.code() == tonic::Code::InvalidArgument {
                match s.message() {
                    m if m.starts_with("invalid ") => m.to_string(),
                    m => format!("invalid request: {m}"),
                }
            } else {
                format!("{:?}: {}", s.code(), s.message())
            }
        } else {
            cause.to_string()
        };
        // libraries often repeat their cause in their own message
        if parts.last().is_some_and(|p| p.ends_with(&text)) {
            continue;
        }
        parts.push(text);
    }
    // a status message is the agent's text (it may quote a request): one line, escaped
    esc(&parts.join(": ")).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_row_cuts_a_long_message_and_says_where_the_rest_is() {
        let long = "restored /etc/é".repeat(100);
        let op = pb::Operation {
            id: "big".into(),
            message: long.clone(),
            ..Default::default()
        };
        let out = history(std::slice::from_ref(&op));
        let row = out.lines().nth(1).unwrap();
        let kept: String = long.chars().take(ROW_MESSAGE_CHARS).collect();
        let rest = long.chars().count() - ROW_MESSAGE_CHARS;
        assert!(
            row.ends_with(&format!(
                "{kept}... ({rest} more characters: inplacectl get big)"
            )),
            "{row}"
        );
        let short = pb::Operation {
            id: "small".into(),
            message: "0 change(s) applied".into(),
            ..Default::default()
        };
        assert!(history(&[short]).ends_with("0 change(s) applied\n"));
    }

    #[test]
    fn agent_strings_can_not_forge_table_rows() {
        let op = pb::Operation {
            id: "op-1".into(),
            message: "done\nop-2  2026-01-01T00:00:00Z  Succeeded  \u{1b}[31m".into(),
            actions: vec!["wrote /etc/x\r\u{202e}".into()],
            ..Default::default()
        };
        for out in [history(std::slice::from_ref(&op)), operation(&op)] {
            assert!(!out.lines().any(|l| l.starts_with("op-2")), "{out}");
            assert!(!out.contains(['\u{1b}', '\r', '\u{202e}']), "{out}");
            assert!(out.contains("done\\nop-2"), "{out}");
        }
        let d = pb::FileDiff {
            path: "/etc/a".into(),
            unified: "--- a\n+++ b\n+x\u{1b}]0;pwned\u{7}\ty\n".into(),
            ..Default::default()
        };
        let out = diffs(&[d]);
        assert!(out.contains("+x\\u{1b}]0;pwned\\u{7}\ty\n"), "{out}");
        let mut s = pb::NodeStatus::default();
        s.problems.push("a\nproblem:         forged".into());
        assert_eq!(status(&s).matches("\nproblem:").count(), 1);
    }

    #[test]
    fn an_agent_error_is_one_escaped_line() {
        let e = anyhow::Error::new(tonic::Status::not_found(
            "applying\n[  0.1s] Succeeded\u{1b}]0;x\u{7}",
        ))
        .context("get operation");
        let text = error_chain(&e);
        assert!(!text.contains(['\n', '\u{1b}', '\u{7}']), "{text}");
        assert!(
            text.contains("NotFound: applying\\n[  0.1s] Succeeded\\u{1b}"),
            "{text}"
        );
    }

    #[test]
    fn time_format() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(1_798_502_400), "2026-12-29T00:00:00Z");
    }

    fn kernel_change(id: &str, reason: &str) -> pb::Change {
        pb::Change {
            id: id.into(),
            reason: reason.into(),
            covered: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_backend_is_explained_once_under_the_table_and_in_every_row_when_wide() {
        let backend = "bls: 2 kernel entries in /boot/loader/entries";
        let r = pb::CoverageReport {
            changes: vec![
                kernel_change(
                    "kernelArgs[isolcpus]",
                    &format!("{backend}; appended after the existing arguments"),
                ),
                kernel_change("kernelArgs[quiet]", &format!("{backend}; removes exactly")),
                kernel_change(
                    "sysctls[vm.x]",
                    &format!("{backend}; not a kernel argument"),
                ),
            ],
            facts: Some(pb::NodeFacts {
                kernel_args_backend: backend.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let short = coverage(&r);
        assert_eq!(short.matches(backend).count(), 2, "{short}");
        assert!(
            short.contains("  appended after the existing arguments\n"),
            "{short}"
        );
        assert!(
            short.contains(&format!("\nkernelArgs backend: {backend}\n")),
            "{short}"
        );
        assert!(!short.contains("kernel args:"), "{short}");
        let wide = coverage_wide(&r);
        assert_eq!(wide.matches(backend).count(), 4, "{wide}");
        assert!(!wide.contains("kernelArgs backend:"), "{wide}");
    }

    #[test]
    fn a_reason_from_another_backend_is_kept_whole() {
        let r = pb::CoverageReport {
            changes: vec![kernel_change("kernelArgs", "grub: other; appended")],
            facts: Some(pb::NodeFacts {
                kernel_args_backend: "bls: 1 kernel entry".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = coverage(&r);
        assert!(out.contains("grub: other; appended"), "{out}");
        assert!(!out.contains("kernelArgs backend:"), "{out}");
    }

    #[test]
    fn phase_names() {
        assert_eq!(phase(Phase::RebootRequired as i32), "RebootRequired");
    }
}
