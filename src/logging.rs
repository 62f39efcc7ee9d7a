//! Logging: journald with structured fields under systemd, readable lines on stderr
//! otherwise.
//!
//! Under systemd (stderr connected to the journal, `systemd_journal_logger::connected_to_journal`)
//! every tracing event is sent with `systemd-journal-logger`: the message, the priority,
//! the target, and each event field as a journal field in upper case (`OPERATION=`,
//! `PHASE=`, `ITEM=`), so `journalctl -u inplaced OPERATION=my-op` finds an operation's
//! lines. Elsewhere a `tracing_subscriber::fmt` layer prints lines on stderr, with colours
//! only on a terminal.

use std::fmt::Write as _;

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
        let kvs: Vec<(&str, &str)> = f.kv.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        // the message also carries the fields, for readers that show MESSAGE only
        let mut message = f.message.clone();
        for (k, v) in &f.kv {
            let _ = write!(message, " {k}={v}");
        }
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
}
