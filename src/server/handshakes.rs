//! The handshake budget of a TLS listener: what unauthenticated peers may hold.
//!
//! Before its TLS handshake a connection proves nothing, so it gets no connection place
//! (those are for authenticated clients, [`super::places`]); it holds one of the
//! listener's `handshake_budget` pending handshakes instead, under three rules:
//!
//! - **Per source.** One source (an IPv4 address, an IPv6 /64, the unit one host
//!   usually gets, RFC 6177) holds at most `handshakes_per_source` pending handshakes;
//!   a newer one from it drops its oldest ([`Reason::PerSourceCap`]).
//! - **Oldest of the busiest source goes.** When the budget is full, a new handshake is
//!   admitted and the oldest pending handshake of the source holding the most is dropped
//!   ([`Reason::BudgetEvicted`]). A live client's handshake takes milliseconds and its
//!   source holds one or two, so idle sockets held open and refilled are what gets
//!   dropped: to reach a client's handshake a flood needs more sources than the budget.
//! - **Deadlines.** The ClientHello within [`super::tls::HELLO_TIMEOUT`], the whole
//!   handshake within [`super::tls::HANDSHAKE_TIMEOUT`] ([`super::tls::handshake`]).
//!
//! So however many idle connections anyone holds or refills, a new handshake starts at
//! once; nothing waits for a place held by a peer that has not authenticated.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

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

/// The pending handshakes of one listener.
#[derive(Debug)]
pub struct Handshakes {
    budget: usize,
    per_source: usize,
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

    /// The oldest handshake of the source holding the most (ties: the source whose
    /// oldest is oldest).
    fn victim(&self) -> Option<u64> {
        self.by_source
            .values()
            .filter_map(|ids| Some((ids.len(), *ids.first()?)))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, id)| id)
    }
}

impl Handshakes {
    /// A budget of `budget` pending handshakes, at most `per_source` from one source
    /// (both at least 1).
    pub fn new(budget: usize, per_source: usize) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            budget: budget.max(1),
            per_source: per_source.max(1),
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a handshake from `ip`, dropping the handshakes the rules above say.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Ticket {
        let source = Source::of(ip);
        let mut st = self.lock();
        let oldest_of_source = st
            .by_source
            .get(&source)
            .filter(|ids| ids.len() >= self.per_source)
            .and_then(|ids| ids.first().copied());
        if let Some(id) = oldest_of_source {
            st.evict(id, Reason::PerSourceCap);
        } else if st.pending.len() >= self.budget
            && let Some(id) = st.victim()
        {
            st.evict(id, Reason::BudgetEvicted);
        }
        let id = st.next;
        st.next += 1;
        let (tx, rx) = oneshot::channel();
        st.pending.insert(id, Pending { source, evict: tx });
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
        assert_eq!(Source::of(ip("::ffff:10.0.0.1")), Source::of(ip("10.0.0.1")));
    }

    #[tokio::test]
    async fn a_source_over_its_cap_loses_its_oldest() {
        let h = Handshakes::new(100, 2);
        let mut a = h.admit(ip("10.0.0.1"));
        let _b = h.admit(ip("10.0.0.1"));
        let _c = h.admit(ip("10.0.0.1"));
        assert_eq!(a.evicted().await, Reason::PerSourceCap);
        assert_eq!(h.pending(), 2);
    }

    #[tokio::test]
    async fn a_full_budget_drops_the_busiest_sources_oldest() {
        let h = Handshakes::new(4, 8);
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
}
