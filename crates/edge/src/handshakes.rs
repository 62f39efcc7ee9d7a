//! The handshake budget of a TLS listener: what unauthenticated peers may hold.
//!
//! Before its TLS handshake a connection proves nothing, so it gets no connection place
//! (those are for authenticated clients, [`super::places`]); it holds one of the
//! listener's `handshake_budget` pending handshakes instead, under three rules:
//!
//! - **Per source.** One source (an IPv4 address, an IPv6 /64, the unit one host
//!   usually gets, RFC 6177) holds at most `handshakes_per_source` handshakes older than
//!   [`FRESH`]: a newer one from it drops its oldest ([`Reason::PerSourceCap`]). A burst
//!   of fresh handshakes (a client opening many connections at once, as CAPI's Go client
//!   does for concurrent hooks) is admitted up to [`BURST`] times the cap.
//! - **Oldest of the busiest stale source goes.** When the budget is full, a new
//!   handshake is admitted and the oldest pending handshake of the source holding the
//!   most, among the sources whose oldest is older than [`FRESH`] (else among all), is
//!   dropped ([`Reason::BudgetEvicted`]). A live client's handshake takes one round trip
//!   and its source holds one or a burst of fresh ones, so idle sockets held open and
//!   refilled are what gets dropped: to reach a client's handshake a flood needs more
//!   sources than the budget.
//! - **Deadlines.** The ClientHello within [`super::tls::HELLO_TIMEOUT`], the whole
//!   handshake within [`super::tls::HANDSHAKE_TIMEOUT`] ([`super::tls::handshake`]).
//!
//! So however many idle connections anyone holds or refills, a new handshake starts at
//! once; nothing waits for a place held by a peer that has not authenticated.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::refusals::Reason;

/// Where a connection comes from, for the per-source cap: an IPv4 address, or the /64
/// of an IPv6 one (an IPv4-mapped IPv6 address is its IPv4 address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// An IPv4 address.
    V4(std::net::Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6(u64),
}

impl Source {
    /// The source of `ip`.
    pub fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(a) => Source::V4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4),
                None => Source::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

/// A handshake pending for less than this is taken for a client at work (a TLS handshake
/// takes a round trip and some crypto: milliseconds, a few hundred over a WAN), and is
/// dropped only when no older one can be.
pub const FRESH: Duration = Duration::from_secs(1);

/// A source may hold this many times `handshakes_per_source` while its handshakes are
/// fresh (a burst); past that its oldest is dropped whatever its age.
pub const BURST: usize = 4;

/// The pending handshakes of one listener.
#[derive(Debug)]
pub struct Handshakes {
    budget: usize,
    per_source: usize,
    fresh: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Pending handshakes by admission order (oldest first).
    pending: BTreeMap<u64, Pending>,
    by_source: HashMap<Source, BTreeSet<u64>>,
}

#[derive(Debug)]
struct Pending {
    source: Source,
    since: Instant,
    evict: oneshot::Sender<Reason>,
}

/// One admitted handshake: its place in the budget until dropped, and the signal that
/// it was dropped for a newer one.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    owner: Arc<Handshakes>,
    evicted: oneshot::Receiver<Reason>,
}

impl Ticket {
    /// Resolves with the reason when this handshake is dropped for a newer one; never
    /// otherwise.
    pub async fn evicted(&mut self) -> Reason {
        match (&mut self.evicted).await {
            Ok(r) => r,
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.owner.lock();
        if let Some(p) = st.pending.remove(&self.id) {
            st.unlink(p.source, self.id);
        }
    }
}

impl State {
    fn unlink(&mut self, source: Source, id: u64) {
        if let Some(ids) = self.by_source.get_mut(&source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&source);
            }
        }
    }

    /// Drops handshake `id`, telling its task why.
    fn evict(&mut self, id: u64, why: Reason) {
        if let Some(p) = self.pending.remove(&id) {
            self.unlink(p.source, id);
            let _ = p.evict.send(why);
        }
    }

    /// When handshake `id` started.
    fn since(&self, id: u64) -> Option<Instant> {
        self.pending.get(&id).map(|p| p.since)
    }

    /// The oldest handshake of the source holding the most, among the sources whose
    /// oldest started before `stale` (else among all; ties: the source whose oldest is
    /// oldest).
    fn victim(&self, stale: Instant) -> Option<u64> {
        let busiest = |only_stale: bool| {
            self.by_source
                .values()
                .filter_map(|ids| Some((ids.len(), *ids.first()?)))
                .filter(|(_, oldest)| {
                    !only_stale || self.since(*oldest).is_some_and(|t| t <= stale)
                })
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                .map(|(_, id)| id)
        };
        busiest(true).or_else(|| busiest(false))
    }
}

impl Handshakes {
    /// A budget of `budget` pending handshakes, at most `per_source` from one source
    /// (both at least 1).
    pub fn new(budget: usize, per_source: usize) -> Arc<Handshakes> {
        Handshakes::with_fresh(budget, per_source, FRESH)
    }

    /// [`Handshakes::new`] with another age than [`FRESH`].
    pub fn with_fresh(budget: usize, per_source: usize, fresh: Duration) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            budget: budget.max(1),
            per_source: per_source.max(1),
            fresh,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a handshake from `ip`, dropping the handshakes the rules above say.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Ticket {
        let source = Source::of(ip);
        let now = Instant::now();
        let stale = now.checked_sub(self.fresh).unwrap_or(now);
        let mut st = self.lock();
        let oldest_of_source = st
            .by_source
            .get(&source)
            .filter(|ids| ids.len() >= self.per_source)
            .and_then(|ids| {
                let oldest = *ids.first()?;
                let burst = ids.len() < BURST * self.per_source;
                (!burst || st.since(oldest).is_some_and(|t| t <= stale)).then_some(oldest)
            });
        if let Some(id) = oldest_of_source {
            st.evict(id, Reason::PerSourceCap);
        } else if st.pending.len() >= self.budget
            && let Some(id) = st.victim(stale)
        {
            st.evict(id, Reason::BudgetEvicted);
        }
        let id = st.next;
        st.next += 1;
        let (tx, rx) = oneshot::channel();
        st.pending.insert(
            id,
            Pending {
                source,
                since: now,
                evict: tx,
            },
        );
        st.by_source.entry(source).or_default().insert(id);
        Ticket {
            id,
            owner: self.clone(),
            evicted: rx,
        }
    }

    /// Handshakes pending now.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sources_group_ipv6_by_64() {
        assert_eq!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            Source::of(ip("::ffff:10.0.0.1")),
            Source::of(ip("10.0.0.1"))
        );
    }

    #[tokio::test]
    async fn a_source_over_its_cap_loses_its_oldest() {
        let h = Handshakes::with_fresh(100, 2, Duration::ZERO);
        let mut a = h.admit(ip("10.0.0.1"));
        let _b = h.admit(ip("10.0.0.1"));
        let _c = h.admit(ip("10.0.0.1"));
        assert_eq!(a.evicted().await, Reason::PerSourceCap);
        assert_eq!(h.pending(), 2);
    }

    #[tokio::test]
    async fn a_full_budget_drops_the_busiest_sources_oldest() {
        let h = Handshakes::with_fresh(4, 8, Duration::ZERO);
        let mut flood: Vec<Ticket> = (0..3).map(|_| h.admit(ip("10.0.0.1"))).collect();
        flood.push(h.admit(ip("10.0.0.2")));
        // full: the client's handshake drops the busiest source's oldest
        let mut client = h.admit(ip("10.0.0.9"));
        assert_eq!(flood[0].evicted().await, Reason::BudgetEvicted);
        // a refilling flood from another source drops its own, never the client's
        for _ in 0..50 {
            flood.push(h.admit(ip("10.0.0.3")));
        }
        assert_eq!(h.pending(), 4);
        let r = tokio::time::timeout(std::time::Duration::from_millis(20), client.evicted()).await;
        assert!(r.is_err(), "the client's handshake was dropped");
        // a finished handshake frees its place
        drop(flood);
        assert_eq!(h.pending(), 1);
    }

    /// A client's burst of fresh handshakes is admitted over the per-source cap, and a
    /// full budget drops the stale flood's handshakes, not the burst's.
    #[tokio::test]
    async fn fresh_bursts_are_kept_and_stale_floods_dropped() {
        let h = Handshakes::with_fresh(40, 8, Duration::from_millis(200));
        let mut flood: Vec<Ticket> = (0..32)
            .map(|i| h.admit(IpAddr::from([10, 0, 1, i / 8])))
            .collect();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let mut burst: Vec<Ticket> = (0..20).map(|_| h.admit(ip("10.0.0.9"))).collect();
        // (a burst past BURST times the cap loses its oldest: 4 x 8 = 32)
        assert_eq!(h.pending(), 40);
        for t in &mut burst {
            let r = tokio::time::timeout(Duration::from_millis(5), t.evicted()).await;
            assert!(r.is_err(), "a handshake of the burst was dropped");
        }
        let mut dropped = 0;
        for t in &mut flood {
            if tokio::time::timeout(Duration::from_millis(5), t.evicted()).await
                == Ok(Reason::BudgetEvicted)
            {
                dropped += 1;
            }
        }
        assert_eq!(dropped, 12);
    }
}
