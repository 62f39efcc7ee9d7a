//! Refused connections of both servers, counted per reason and logged at a bounded rate.
//!
//! Every connection a TLS listener drops before serving it is one [`Reason`]; the
//! counter `<prefix>_tls_handshakes_refused_total{reason}` (`inplaced_...` on the agent,
//! `inplace_extension_...` on the extension) counts it, and every known reason is exported
//! at 0 from the start, so a rate can be taken before the first refusal.
//!
//! Logs: within one [`LOG_INTERVAL`] the first refusal of each *kind* is logged with its
//! details (peer address, error, the certificate's names); the rest are counted, and one
//! summary line per interval gives the counts per reason. A kind is the listener and the
//! reason, plus the certificate's names for [`Reason::NotAllowlisted`] and
//! [`Reason::IdentityCap`] (those need a certificate the client CA signed, so their names
//! are the CA owner's to choose, and each is worth seeing once); at most [`MAX_KINDS`]
//! kinds are logged per interval. So however many anonymous attempts arrive, a listener
//! writes at most a dozen lines per interval (8 anonymous reasons and one summary), not
//! one per attempt: 5 000 attempts can not spend journald's rate limit
//! (`RateLimitBurst=10000` per 30 s by default, `journald.conf(5)`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Why a connection was dropped before it was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The client sent no certificate (rustls `NoCertificatesPresented`).
    NoCertificate,
    /// The client's certificate does not verify against the client CA (unknown issuer,
    /// expired, wrong extended key usage, bad signature).
    BadCertificate,
    /// A verified certificate that no allowlist entry matches.
    NotAllowlisted,
    /// No ClientHello within [`super::tls::HELLO_TIMEOUT`], or the handshake unfinished
    /// at [`super::tls::HANDSHAKE_TIMEOUT`].
    Timeout,
    /// Its source (IPv4 address, IPv6 /64) had `handshakes_per_source` handshakes
    /// pending and a newer one arrived: the oldest of that source is dropped.
    PerSourceCap,
    /// The handshake budget was full and a newer handshake arrived: the oldest handshake
    /// of the source with the most pending is dropped.
    BudgetEvicted,
    /// Not TLS, or TLS the server does not speak (versions, ciphers, ALPN, a bad message).
    Protocol,
    /// The peer closed the connection before the handshake finished (port scanners, TCP
    /// health checks).
    Closed,
    /// A reader identity already holds `api.tcp.connections_per_reader` connections.
    IdentityCap,
    /// Authenticated, but no connection place freed within [`super::places::PLACE_WAIT`]
    /// (`max_connections` taken), or too many waited already.
    ConnectionCap,
}

impl Reason {
    /// Every reason, in label order.
    pub const ALL: [Reason; 10] = [
        Reason::NoCertificate,
        Reason::BadCertificate,
        Reason::NotAllowlisted,
        Reason::Timeout,
        Reason::PerSourceCap,
        Reason::BudgetEvicted,
        Reason::Protocol,
        Reason::Closed,
        Reason::IdentityCap,
        Reason::ConnectionCap,
    ];

    /// The metric label (`no_certificate`, `budget_evicted`, ...).
    pub fn label(self) -> &'static str {
        match self {
            Reason::NoCertificate => "no_certificate",
            Reason::BadCertificate => "bad_certificate",
            Reason::NotAllowlisted => "not_allowlisted",
            Reason::Timeout => "timeout",
            Reason::PerSourceCap => "per_source_cap",
            Reason::BudgetEvicted => "budget_evicted",
            Reason::Protocol => "protocol",
            Reason::Closed => "closed",
            Reason::IdentityCap => "identity_cap",
            Reason::ConnectionCap => "connection_cap",
        }
    }

    /// The reason of a failed server handshake (the `io::Error` tokio-rustls returns,
    /// which wraps the `rustls::Error`).
    pub fn of_handshake_error(e: &std::io::Error) -> Reason {
        use std::io::ErrorKind as K;
        if let Some(r) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return match r {
                rustls::Error::NoCertificatesPresented => Reason::NoCertificate,
                rustls::Error::InvalidCertificate(_) => Reason::BadCertificate,
                _ => Reason::Protocol,
            };
        }
        match e.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                Reason::Closed
            }
            _ => Reason::Protocol,
        }
    }
}

/// How often the summary of refusals not logged one by one is written.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Most kinds of refusal logged one by one per interval.
pub const MAX_KINDS: usize = 32;

type Labels = Vec<(String, String)>;

/// The refusal counters of the process and the log's state.
#[derive(Debug)]
pub struct Refusals {
    counts: Family<Labels, Counter>,
    log: Mutex<LogState>,
    ticker: std::sync::Once,
}

#[derive(Debug)]
struct LogState {
    since: Instant,
    logged: BTreeSet<String>,
    /// Refusals counted but not logged this interval, by listener and reason.
    unlogged: BTreeMap<(&'static str, Reason), u64>,
}

static REFUSALS: OnceLock<Refusals> = OnceLock::new();

/// The process's refusals (created on first use, every reason at 0).
pub fn get() -> &'static Refusals {
    REFUSALS.get_or_init(|| {
        let counts = Family::<Labels, Counter>::default();
        for r in Reason::ALL {
            let _ = counts.get_or_create(&vec![("reason".into(), r.label().into())]);
        }
        Refusals {
            counts,
            log: Mutex::new(LogState {
                since: Instant::now(),
                logged: BTreeSet::new(),
                unlogged: BTreeMap::new(),
            }),
            ticker: std::sync::Once::new(),
        }
    })
}

impl Refusals {
    /// The counter family, to register as `tls_handshakes_refused` in a registry.
    pub fn family(&self) -> Family<Labels, Counter> {
        self.counts.clone()
    }

    /// How many refusals of `reason` were counted.
    pub fn count(&self, reason: Reason) -> u64 {
        self.counts
            .get_or_create(&vec![("reason".into(), reason.label().into())])
            .get()
    }

    /// Counts one refusal on `listener` (a config section: `api.tcp`, `server`); runs
    /// `log` (which writes its line) when it is the first of its kind this interval, where
    /// `names` (the certificate's names, empty when none) joins the kind of
    /// [`Reason::NotAllowlisted`] and [`Reason::IdentityCap`].
    pub fn refused(
        &'static self,
        listener: &'static str,
        reason: Reason,
        names: &str,
        log: impl FnOnce(),
    ) {
        self.counts
            .get_or_create(&vec![("reason".into(), reason.label().into())])
            .inc();
        self.start_ticker();
        let mut st = self.log.lock().unwrap_or_else(|p| p.into_inner());
        flush(&mut st);
        let kind = match reason {
            Reason::NotAllowlisted | Reason::IdentityCap => {
                format!("{listener} {} {names}", reason.label())
            }
            _ => format!("{listener} {}", reason.label()),
        };
        if !st.logged.contains(&kind) && st.logged.len() < MAX_KINDS {
            st.logged.insert(kind);
            drop(st);
            log();
        } else {
            *st.unlogged.entry((listener, reason)).or_default() += 1;
        }
    }

    /// Writes the summary every [`LOG_INTERVAL`] from a background task (started once,
    /// on the first refusal, when a Tokio runtime runs).
    fn start_ticker(&'static self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.ticker.call_once(|| {
            tokio::spawn(async move {
                let mut every = tokio::time::interval(LOG_INTERVAL);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    let mut st = self.log.lock().unwrap_or_else(|p| p.into_inner());
                    flush(&mut st);
                }
            });
        });
    }
}

/// Ends the interval when it is over: one summary line per listener with the
/// refusals not logged one by one, then a new interval.
fn flush(st: &mut LogState) {
    if st.since.elapsed() < LOG_INTERVAL {
        return;
    }
    let seconds = st.since.elapsed().as_secs();
    let mut by_listener: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for ((listener, reason), n) in std::mem::take(&mut st.unlogged) {
        by_listener
            .entry(listener)
            .or_default()
            .push(format!("{}={n}", reason.label()));
    }
    for (listener, counts) in by_listener {
        tracing::warn!(
            listener,
            seconds,
            refused = %counts.join(","),
            "connections refused before they were served, not logged one by one (first of each reason logged above; counts in tls_handshakes_refused_total)"
        );
    }
    st.logged.clear();
    st.since = Instant::now();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_labelled_and_errors_classified() {
        let labels: BTreeSet<_> = Reason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
        let wrap = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        assert_eq!(
            Reason::of_handshake_error(&wrap(rustls::Error::NoCertificatesPresented)),
            Reason::NoCertificate
        );
        assert_eq!(
            Reason::of_handshake_error(&wrap(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))),
            Reason::BadCertificate
        );
        assert_eq!(
            Reason::of_handshake_error(&wrap(rustls::Error::NoApplicationProtocol)),
            Reason::Protocol
        );
        assert_eq!(
            Reason::of_handshake_error(&std::io::ErrorKind::UnexpectedEof.into()),
            Reason::Closed
        );
    }

    #[test]
    fn one_line_per_kind_per_interval() {
        let r = get();
        let before = r.count(Reason::Protocol);
        let mut lines = 0;
        for _ in 0..1000 {
            r.refused("t", Reason::Protocol, "", || lines += 1);
        }
        assert!(lines <= 1, "{lines} lines for 1000 refusals of one kind");
        assert_eq!(r.count(Reason::Protocol) - before, 1000);
        // certificate names make kinds of their own
        let mut named = 0;
        for n in ["a", "b", "a"] {
            r.refused("t", Reason::NotAllowlisted, n, || named += 1);
        }
        assert!(named <= 2);
    }
}
