//! Logging: journald with structured fields under systemd, readable lines on stderr
//! otherwise.
//!
//! Under systemd (stderr connected to the journal, `systemd_journal_logger::connected_to_journal`)
//! every tracing event is sent with `systemd-journal-logger`: the message, the priority,
//! the target, and each event field as a journal field in upper case (`OPERATION=`,
//! `PHASE=`, `ITEM=`), so `journalctl -u inplaced OPERATION=my-op` finds an operation's
//! lines. Elsewhere a `tracing_subscriber::fmt` layer prints lines on stderr, with colours
//! only on a terminal.

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
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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
                .target(meta.target())
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

/// Installs the global subscriber: journald when stderr is the journal, stderr lines
/// otherwise. `filter` is an `EnvFilter` directive (`info`, `inplaced=debug`).
pub fn init(filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
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
            .fmt_fields(escaped_fields())
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journal)
        .with(fmt)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::Fields;
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
}
