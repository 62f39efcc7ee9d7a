//! Each caller's share of the receive and planning budgets ([`super::admit`]): the calls
//! of one caller hold together at most [`SHARE_DIVISOR`]⁻¹ of each budget, a call
//! costlier than that taking the caller's whole share (it runs alone among the caller's
//! calls, as a call costlier than a budget takes all of it).
//!
//! A call takes its caller's share before the budget, so a caller's further calls wait
//! here, outside the budgets' queues (tokio's semaphores serve waiters in order, a large
//! request at the head holding back smaller ones behind it). Without it, a reader that
//! queued its 16 calls (`api.tcp.calls_per_reader`) of specs at the limits, each answer
//! left unread until its connection is closed ([`super::answer`]), kept every other
//! caller behind all of them, one deadline each; with it, others queued meanwhile are
//! served after the one call the caller has in the budget.
//!
//! A caller is who the connection's identity says: on TCP the `[[api.tcp.clients]]`
//! entry that admitted it (the unit of `connections_per_reader` and `calls_per_reader`;
//! each connection of `insecure_loopback`), on the local socket the peer's uid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::codegen::http;

/// One caller's share of each budget is the budget divided by this (a half).
pub(crate) const SHARE_DIVISOR: u32 = 2;

/// The callers with a call holding or waiting for a share, by [`caller_of`].
#[derive(Debug)]
pub(crate) struct Callers {
    by_caller: Mutex<HashMap<String, Weak<Shares>>>,
    receiving_kib: u32,
    planning_kib: u32,
}

/// One caller's shares, KiB; its calls hold it (through [`super::admit::Held`]) while
/// they hold a part of it.
#[derive(Debug)]
pub(crate) struct Shares {
    receiving: Arc<Semaphore>,
    receiving_kib: u32,
    planning: Arc<Semaphore>,
    planning_kib: u32,
}

impl Callers {
    /// Shares of budgets of `receiving_kib` and `planning_kib` KiB.
    pub(crate) fn new(receiving_kib: u32, planning_kib: u32) -> Callers {
        Callers {
            by_caller: Mutex::new(HashMap::new()),
            receiving_kib: (receiving_kib / SHARE_DIVISOR).max(1),
            planning_kib: (planning_kib / SHARE_DIVISOR).max(1),
        }
    }

    /// The shares of the caller of a request with extensions `ext`.
    pub(crate) fn of(&self, ext: &http::Extensions) -> Arc<Shares> {
        let caller = caller_of(ext);
        let mut by_caller = self
            .by_caller
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = by_caller.get(&caller).and_then(Weak::upgrade) {
            return s;
        }
        // callers come and go with their connections: forget those with no call
        if by_caller.len() >= 64 {
            by_caller.retain(|_, s| s.strong_count() > 0);
        }
        let s = Arc::new(Shares {
            receiving: Arc::new(Semaphore::new(self.receiving_kib as usize)),
            receiving_kib: self.receiving_kib,
            planning: Arc::new(Semaphore::new(self.planning_kib as usize)),
            planning_kib: self.planning_kib,
        });
        by_caller.insert(caller, Arc::downgrade(&s));
        s
    }
}

impl Shares {
    /// `kib` of the caller's receive share (all of it when that is less), waiting for
    /// the caller's other calls.
    pub(crate) async fn receiving(&self, kib: u32) -> Result<OwnedSemaphorePermit, Status> {
        take(&self.receiving, kib.min(self.receiving_kib)).await
    }

    /// `kib` of the caller's planning share (all of it when that is less), waiting for
    /// the caller's other calls.
    pub(crate) async fn planning(&self, kib: u32) -> Result<OwnedSemaphorePermit, Status> {
        take(&self.planning, kib.min(self.planning_kib)).await
    }
}

async fn take(s: &Arc<Semaphore>, kib: u32) -> Result<OwnedSemaphorePermit, Status> {
    s.clone()
        .acquire_many_owned(kib)
        .await
        .map_err(|_| Status::unavailable("the agent is stopping"))
}

/// Who a request's caller is (see the module doc), from its connection info.
fn caller_of(ext: &http::Extensions) -> String {
    if let Some(p) = ext.get::<inplace_edge::tls::TlsPeer>() {
        return match (&p.entry, p.remote) {
            (Some(entry), _) => format!("entry {entry}"),
            (None, Some(remote)) => format!("connection {remote}"),
            (None, None) => "tcp".into(),
        };
    }
    match ext
        .get::<inplace_edge::accept::LocalPeer>()
        .and_then(|p| p.uds.peer_cred)
    {
        Some(cred) => format!("uid {}", cred.uid()),
        None => "local".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn from(entry: &str) -> http::Extensions {
        let mut ext = http::Extensions::new();
        ext.insert(inplace_edge::tls::TlsPeer {
            remote: None,
            identities: vec![entry.to_string()],
            role: Some(inplace_edge::listener::Role::Reader),
            calls: None,
            entry: Some(entry.to_string()),
            closer: inplace_edge::closer::Closer::new(),
        });
        ext
    }

    /// A caller holding its share makes its own next call wait, not another caller's;
    /// a call costlier than the share takes all of it and still runs.
    #[tokio::test]
    async fn a_caller_waits_for_its_own_share_only() {
        let callers = Callers::new(100, 1000);
        let wait = Duration::from_millis(50);
        let a = callers.of(&from("a"));
        let big = a
            .planning(5000)
            .await
            .expect("costlier than the share: runs");
        let again = tokio::time::timeout(wait, callers.of(&from("a")).planning(1)).await;
        assert!(again.is_err(), "a's second call did not wait for a's share");
        let b = tokio::time::timeout(wait, callers.of(&from("b")).planning(500)).await;
        assert!(b.is_ok(), "b waited for a's share");
        let r = tokio::time::timeout(wait, a.receiving(50)).await;
        assert!(
            r.is_ok(),
            "the receive share is apart from the planning share"
        );
        drop(big);
        let again = tokio::time::timeout(wait, callers.of(&from("a")).planning(1)).await;
        assert!(again.is_ok(), "a's share came back");
    }

    /// A caller without calls is forgotten once enough others came.
    #[tokio::test]
    async fn callers_without_calls_are_forgotten() {
        let callers = Callers::new(100, 100);
        for i in 0..200 {
            drop(callers.of(&from(&format!("c{i}"))));
        }
        let kept = callers.of(&from("kept"));
        for i in 200..300 {
            drop(callers.of(&from(&format!("c{i}"))));
        }
        let n = callers.by_caller.lock().unwrap().len();
        assert!(n <= 64, "{n} callers remembered");
        assert!(Arc::ptr_eq(&kept, &callers.of(&from("kept"))));
    }
}
