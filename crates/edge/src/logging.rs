//! Logging: journald with structured fields under systemd, readable lines on stderr
//! otherwise.
//!
//! Under systemd (stderr connected to the journal, `systemd_journal_logger::connected_to_journal`)
//! every tracing event is sent with `systemd-journal-logger`: the message, the priority,
//! the target, and each event field as a journal field in upper case (`OPERATION=`,
//! `PHASE=`, `ITEM=`), so `journalctl -u inplaced OPERATION=my-op` finds an operation's
//! lines. Elsewhere a `tracing_subscriber::fmt` layer prints lines on stderr, with colours
//! only on a terminal.
//!
//! Targets keep the program's name as their root, as before the code was split into
//! crates: an event of `inplace_agent::server` is logged with the target
//! `inplaced::server`, one of `inplace_node::sysroot` with `inplaced::node::sysroot`
//! ([`log_target`]), and a `--log` filter names them that way (`inplaced=debug`,
//! `inplaced::server=trace`; [`filter_directives`] turns it into the crates' paths).

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` with every character that could forge a line or drive a terminal written as an
/// escape: `\n`, `\r`, `\t` as those two characters, other C0 and C1 controls and DEL
/// as `\u{..}`, and the Unicode line and paragraph separators and bidirectional
/// controls (U+2028/9, U+061C, U+200E/F, U+202A..E, U+2066..9: every Bidi_Control
/// character of Unicode's PropList.txt; the "Trojan Source" class,
/// CVE-2021-42574) likewise. Text without any is borrowed unchanged. Used for every
/// string that may come from a request or an agent: the log lines of both programs and
/// `inplacectl`'s tables.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    fn risky(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{061C}' | '\u{2028}' | '\u{2029}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    }
    if !s.chars().any(risky) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if risky(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`escape_controls`] for multi-line text that is meant to have lines (a unified
/// diff): each line's content is escaped, the `\n` between lines and tabs are kept.
pub fn escape_controls_in_lines(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| {
        c != '\n' && c != '\t' && escape_controls(c.encode_utf8(&mut [0; 4])).len() > c.len_utf8()
    }) {
        return Cow::Borrowed(s);
    }
    let lines: Vec<String> = s
        .split('\n')
        .map(|l| {
            l.split('\t')
                .map(|p| escape_controls(p).into_owned())
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect();
    Cow::Owned(lines.join("\n"))
}

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// A tracing layer sending events to journald through `systemd-journal-logger`.
pub struct JournalLayer {
    journal: systemd_journal_logger::JournalLog,
}

impl std::fmt::Debug for JournalLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalLayer")
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    kv: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            // an event with a format string and a `message = ...` field has two: join them
            if !self.message.is_empty() {
                self.message.push_str(": ");
            }
            let _ = write!(self.message, "{value:?}");
        } else {
            self.kv
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            if !self.message.is_empty() {
                self.message.push_str(": ");
            }
            self.message.push_str(value);
        } else {
            self.kv.push((field.name().to_string(), value.to_string()));
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let meta = event.metadata();
        let level = match *meta.level() {
            tracing::Level::ERROR => log::Level::Error,
            tracing::Level::WARN => log::Level::Warn,
            tracing::Level::INFO => log::Level::Info,
            tracing::Level::DEBUG => log::Level::Debug,
            tracing::Level::TRACE => log::Level::Trace,
        };
        // the message also carries the fields, for readers that show MESSAGE only; every
        // value escaped (a request string must not forge a line in `journalctl -o cat`)
        let mut message = escape_controls(&f.message).into_owned();
        for (k, v) in &f.kv {
            let _ = write!(message, " {k}={}", escape_controls(v));
        }
        let kv: Vec<(String, String)> =
            f.kv.iter()
                .map(|(k, v)| (k.clone(), escape_controls(v).into_owned()))
                .collect();
        let kvs: Vec<(&str, &str)> = kv.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let _ = self.journal.journal_send(
            &log::Record::builder()
                .args(format_args!("{message}"))
                .level(level)
                .target(&log_target(meta.target()))
                .file(meta.file())
                .line(meta.line())
                .module_path(meta.module_path())
                .key_values(&kvs)
                .build(),
        );
    }
}

/// The stderr formatter's field writer: the message, then ` name=value` for each field,
/// as `tracing_subscriber`'s default writes them, but every value through
/// [`escape_controls`], so a newline or terminal escape in a request string (a Machine
/// name, an agent's message) can not forge a log line or drive a terminal.
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static
{
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        if field.name() == "message" {
            write!(w, "{}", escape_controls(&text))
        } else {
            write!(w, "{field}={}", field_value(&text))
        }
    })
    .delimited(" ")
}

/// A field value for a `name=value` log line: escaped ([`escape_controls`]), and quoted
/// (`"..."` with `\"` and `\\` escaped) when it holds a space, `=` or `"`, so text from a
/// request can not add a field of its own to the line (`machine=a covered=true`). Values
/// that are already a Debug-quoted string (start and end with `"`) are kept as they are.
fn field_value(text: &str) -> Cow<'_, str> {
    let escaped = escape_controls(text);
    if debug_quoted(text) || !escaped.contains([' ', '=', '"']) {
        return escaped;
    }
    // as Debug quotes: `\` and `"` first, then the controls (so `\n` inside the quotes is
    // a newline, `\\n` a backslash and an n)
    let inner = text.replace('\\', "\\\\").replace('"', "\\\"");
    Cow::Owned(format!("\"{}\"", escape_controls(&inner)))
}

/// Whether `text` is one Debug-quoted string: `"` at both ends and every `"` between
/// them escaped with a backslash.
fn debug_quoted(text: &str) -> bool {
    let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return false;
    };
    let mut escaped = false;
    for c in inner.chars() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '"') => return false,
            _ => escaped = false,
        }
    }
    !escaped
}

/// The library crates whose events are logged under the program's `inplaced` root, and
/// the path each takes there (the agent's own modules sit at the root, as before the
/// workspace split).
const CRATES: [(&str, &str); 6] = [
    ("inplace_agent", "inplaced"),
    ("inplace_extension", "inplaced::extension"),
    ("inplace_node", "inplaced::node"),
    ("inplace_edge", "inplaced::edge"),
    ("inplace_formats", "inplaced::formats"),
    ("inplace_wire", "inplaced::wire"),
];

/// The target an event is logged with: a module path of one of the project's crates
/// (`inplace_agent::server`) under the program's root as [`CRATES`] says
/// (`inplaced::server`); any other target (a dependency's) unchanged.
pub fn log_target(target: &str) -> Cow<'_, str> {
    for (krate, shown) in CRATES {
        if let Some(rest) = target.strip_prefix(krate)
            && (rest.is_empty() || rest.starts_with("::"))
        {
            return Cow::Owned(format!("{shown}{rest}"));
        }
    }
    Cow::Borrowed(target)
}

/// A `--log` filter (comma-separated `target=level` directives and a bare level,
/// [`parse_filter`]) with every target written as the logs show it ([`log_target`]: `inplaced`, `inplaced::server`,
/// `inplaced::node::sysroot`) turned into the crates' module paths the filter matches:
/// `inplaced` alone names every crate of [`CRATES`]; `inplaced::<path>` the crate whose
/// shown root is the longest prefix of it (`inplaced::node::sysroot` →
/// `inplace_node::sysroot`, `inplaced::apply` → `inplace_agent::apply`). Directives
/// without such a target (`info`, `h2=warn`) are kept as they are.
pub fn filter_directives(filter: &str) -> String {
    let mut out = Vec::new();
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let end = directive.find(['[', '=']).unwrap_or(directive.len());
        let (target, rest) = directive.split_at(end);
        if target == "inplaced" {
            out.extend(CRATES.iter().map(|(krate, _)| format!("{krate}{rest}")));
            continue;
        }
        let mapped = CRATES
            .iter()
            .filter(|(_, shown)| *shown != "inplaced")
            .find_map(|(krate, shown)| {
                let tail = target.strip_prefix(shown)?;
                (tail.is_empty() || tail.starts_with("::")).then(|| format!("{krate}{tail}"))
            })
            .or_else(|| {
                let tail = target.strip_prefix("inplaced::")?;
                Some(format!("inplace_agent::{tail}"))
            });
        out.push(match mapped {
            Some(t) => format!("{t}{rest}"),
            None => directive.to_string(),
        });
    }
    out.join(",")
}

/// The stderr line format: time, level, the target as [`log_target`] shows it, then the
/// fields ([`escaped_fields`]), as `tracing_subscriber`'s full format writes them.
#[derive(Debug, Clone, Copy)]
struct Line;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Line
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime;
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut w)?;
        let meta = event.metadata();
        write!(w, " {:>5} {}: ", meta.level(), log_target(meta.target()))?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// A `--log` filter ([`filter_directives`] applied) as `tracing_subscriber`'s
/// [`Targets`]: comma-separated `target=level` directives and a bare default level
/// (`info`, `inplaced=debug,h2=off`), the most specific target winning, as `RUST_LOG`
/// reads them. `EnvFilter`'s span and field directives (`target[span{field=value}]=level`)
/// are not taken: `EnvFilter` matches field values with regular expressions, and it was,
/// with the config's globs, the daemon's only use of the regex engines (about 0.6 MB of
/// its code; BENCHMARKS.md, "Where the agent's RSS is").
///
/// # Errors
/// Text naming `--log`, the filter and the directive syntax, for a directive `Targets`
/// can not parse (a span filter, an unknown level).
pub fn parse_filter(filter: &str) -> Result<Targets, String> {
    // `Targets` would read `target[span]` as a target of that name, matching nothing
    let span = filter
        .contains(['[', ']', '{', '}'])
        .then_some("a span or field filter");
    let parsed = match span {
        Some(fault) => Err(fault.to_string()),
        None => filter_directives(filter)
            .parse::<Targets>()
            .map_err(|e| e.to_string()),
    };
    parsed.map_err(|e| {
        format!(
            "--log {filter:?}: {e}: the filter takes comma-separated target=level directives and a bare level (e.g. \"info\" or \"inplaced=debug,h2=off\"); span and field filters are not supported"
        )
    })
}

/// Installs the global subscriber: journald when stderr is the journal, stderr lines
/// otherwise, filtered by [`parse_filter`]`(filter)`.
///
/// # Errors
/// [`parse_filter`]'s, before anything is installed.
pub fn init(filter: &str) -> Result<(), String> {
    let filter = parse_filter(filter)?;
    let journal = if systemd_journal_logger::connected_to_journal() {
        systemd_journal_logger::JournalLog::new()
            .ok()
            .map(|j| JournalLayer {
                journal: j.with_syslog_identifier("inplaced".into()),
            })
    } else {
        None
    };
    let fmt = journal.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(Line)
            .fmt_fields(escaped_fields())
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journal)
        .with(fmt)
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Fields, filter_directives, log_target, parse_filter};

    #[test]
    fn targets_keep_the_programs_root() {
        for (target, shown) in [
            ("inplace_agent::server", "inplaced::server"),
            ("inplace_agent", "inplaced"),
            ("inplace_node::sysroot", "inplaced::node::sysroot"),
            ("inplace_edge::tls", "inplaced::edge::tls"),
            (
                "inplace_extension::http::route",
                "inplaced::extension::http::route",
            ),
            ("inplace_agentx::y", "inplace_agentx::y"),
            ("h2::proto", "h2::proto"),
        ] {
            assert_eq!(log_target(target), shown, "{target}");
        }
    }

    #[test]
    fn filters_name_targets_as_the_logs_show_them() {
        assert_eq!(
            filter_directives("inplaced=debug"),
            "inplace_agent=debug,inplace_extension=debug,inplace_node=debug,inplace_edge=debug,inplace_formats=debug,inplace_wire=debug"
        );
        assert_eq!(filter_directives("info"), "info");
        assert_eq!(
            filter_directives("warn, inplaced::server=trace,h2=off"),
            "warn,inplace_agent::server=trace,h2=off"
        );
        assert_eq!(
            filter_directives("inplaced::node::sysroot[op]=debug"),
            "inplace_node::sysroot[op]=debug"
        );
        assert_eq!(
            filter_directives("inplaced::extension=info"),
            "inplace_extension=info"
        );
        // what the logs show, given back as a filter, selects the same target
        for target in [
            "inplace_edge::tls",
            "inplace_agent::apply::engine",
            "inplace_wire",
        ] {
            let shown = log_target(target);
            assert_eq!(
                filter_directives(&format!("{shown}=debug")),
                format!("{target}=debug")
            );
        }
    }

    use super::{debug_quoted, escape_controls, escape_controls_in_lines, field_value};
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    /// Each event's message and fields, as the journal layer sees them.
    type Events = Arc<Mutex<Vec<(String, Vec<(String, String)>)>>>;
    struct Capture(Events);
    impl<S: tracing::Subscriber> Layer<S> for Capture {
        fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
            let mut f = Fields::default();
            event.record(&mut f);
            self.0.lock().unwrap().push((f.message, f.kv));
        }
    }

    // Seen in the VM test's journal: `operation phase` and the operation's `message = ...`
    // field ran together as "operation phasekubelet health check failed".
    #[test]
    fn a_message_field_is_joined_to_the_format_message() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sub = tracing_subscriber::registry().with(Capture(got.clone()));
        tracing::subscriber::with_default(sub, || {
            let detail = "kubelet health check failed";
            tracing::info!(operation = "op-1", message = %detail, "operation phase");
            tracing::info!(item = "kubelet.flags[max-pods]", "change");
        });
        let got = got.lock().unwrap();
        assert_eq!(got[0].0, "operation phase: kubelet health check failed");
        assert_eq!(
            got[0].1,
            vec![("operation".to_string(), "op-1".to_string())]
        );
        assert_eq!(got[1].0, "change");
    }

    #[test]
    fn request_strings_are_escaped_and_fields_can_not_be_added() {
        assert_eq!(escape_controls("plain"), "plain");
        assert_eq!(
            escape_controls("a\nb\rc\td\u{1b}[2J\u{7f}\u{85}"),
            "a\\nb\\rc\\td\\u{1b}[2J\\u{7f}\\u{85}"
        );
        for bidi in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}',
            '\u{2028}', '\u{2029}',
        ] {
            let s = format!("x{bidi}y");
            assert_eq!(escape_controls(&s), format!("x\\u{{{:x}}}y", bidi as u32));
        }
        assert_eq!(
            escape_controls_in_lines("+a\tb\n+c\u{1b}\n"),
            "+a\tb\n+c\\u{1b}\n"
        );
        // a value with a space or `=` is quoted, so it can not pose as another field
        assert_eq!(
            field_value("127.0.0.1:1 machine=site-a/victim covered=true"),
            "\"127.0.0.1:1 machine=site-a/victim covered=true\""
        );
        assert_eq!(field_value("site-a/edge-1"), "site-a/edge-1");
        assert_eq!(field_value(r#"a "b" c"#), r#""a \"b\" c""#);
        // a Debug-quoted string is kept; one that only looks quoted is quoted again
        assert!(debug_quoted(r#""a \" b""#));
        assert!(!debug_quoted(r#""x" covered=true "y""#));
        assert_eq!(
            field_value(r#""x" covered=true "y""#),
            r#""\"x\" covered=true \"y\"""#
        );
    }

    /// The `--log` filter: levels and target directives (the shown names mapped to the
    /// crates') decide what is enabled; a span filter or an unknown level is an error
    /// naming `--log` and the syntax, not a silent `info`.
    #[test]
    fn log_filters_parse_or_name_the_fault() {
        use tracing::Level;
        use tracing_subscriber::filter::LevelFilter;
        let t = parse_filter("warn,inplaced::server=trace,h2=off").unwrap();
        assert!(t.would_enable("inplace_agent::server::coverage", &Level::TRACE));
        assert!(!t.would_enable("inplace_agent::apply", &Level::INFO));
        assert!(t.would_enable("inplace_agent::apply", &Level::WARN));
        assert!(!t.would_enable("h2::proto", &Level::ERROR));
        assert_eq!(
            parse_filter("info").unwrap().default_level(),
            Some(LevelFilter::INFO)
        );
        let t = parse_filter("inplaced=debug").unwrap();
        assert!(t.would_enable("inplace_node::sysroot", &Level::DEBUG));
        assert!(!t.would_enable("hyper", &Level::ERROR));
        for bad in ["inplaced[op]=debug", "inplaced=loud"] {
            let e = parse_filter(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("--log {bad:?}")) && e.contains("target=level"),
                "{e}"
            );
        }
    }
}
