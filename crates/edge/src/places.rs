//! Connection places of authenticated clients, for both servers.
//!
//! A connection gets a place only after its TLS handshake, once its certificate is on the
//! allowlist ([`super::handshakes`] bounds what comes before), so no unauthenticated peer
//! can take one. Places are kept per role:
//!
//! - `max_connections` places in all; `admin_connections` of them only admins may take,
//!   so readers hold at most `max_connections - admin_connections` and an admin always
//!   finds a place that no reader can hold.
//! - Each reader identity (the allowlist entry its certificate matches) holds at most
//!   `connections_per_reader` connections (one more is refused at once,
//!   [`Reason::IdentityCap`]) and `calls_per_reader` calls in flight across them (one more
//!   is answered `RESOURCE_EXHAUSTED`, [`crate::calls::ReaderCallsLayer`]).
//! - With every place of its role taken, a connection waits up to [`PLACE_WAIT`] for one
//!   (as many may wait as there are places; later ones are refused at once), then is
//!   closed ([`Reason::ConnectionCap`]).
//!
//! The extension's clients (CAPI's managers) are all admins: its places have no reserve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::refusals::Reason;

/// Longest an authenticated connection waits for a place.
pub const PLACE_WAIT: Duration = Duration::from_secs(5);

/// Who a connection is, for its place.
#[derive(Debug, Clone, Copy)]
pub enum Holder<'a> {
    /// An admin: any place.
    Admin,
    /// A reader identity (the allowlist entry's identity): reader places, within its caps.
    Reader(&'a str),
}

/// The limits of [`Places`], from the config (`api.tcp.*`, `server.*`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections in all.
    pub max_connections: usize,
    /// Of them, places only admins may take.
    pub admin_connections: usize,
    /// Connections of one reader identity.
    pub connections_per_reader: usize,
    /// Calls in flight of one reader identity.
    pub calls_per_reader: usize,
}

/// The places of one listener.
#[derive(Debug)]
pub struct Places {
    limits: Limits,
    wait: Duration,
    all: Arc<Semaphore>,
    readers: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    identities: Mutex<HashMap<String, Identity>>,
}

#[derive(Debug)]
struct Identity {
    connections: usize,
    calls: Arc<Semaphore>,
}

/// A connection's place, freed when dropped.
#[derive(Debug)]
pub struct Place {
    _all: OwnedSemaphorePermit,
    _reader: Option<OwnedSemaphorePermit>,
    _identity: Option<IdentityHold>,
}

/// A reader identity's count of one connection.
#[derive(Debug)]
struct IdentityHold {
    owner: Arc<Places>,
    identity: String,
}

impl Drop for IdentityHold {
    fn drop(&mut self) {
        let mut ids = self.owner.lock();
        if let Some(i) = ids.get_mut(&self.identity) {
            i.connections = i.connections.saturating_sub(1);
            // forgotten once idle, so the map holds only identities with connections
            if i.connections == 0
                && i.calls.available_permits() == self.owner.limits.calls_per_reader
            {
                ids.remove(&self.identity);
            }
        }
    }
}

impl Places {
    /// Places under `limits` (every count at least 1, the admins' reserve at most all).
    pub fn new(limits: Limits) -> Arc<Places> {
        Places::with_wait(limits, PLACE_WAIT)
    }

    /// [`Places::new`] with another wait than [`PLACE_WAIT`].
    pub fn with_wait(limits: Limits, wait: Duration) -> Arc<Places> {
        let max = limits.max_connections.max(1);
        let limits = Limits {
            max_connections: max,
            admin_connections: limits.admin_connections.min(max),
            connections_per_reader: limits.connections_per_reader.max(1),
            calls_per_reader: limits.calls_per_reader.max(1),
        };
        Arc::new(Places {
            all: Arc::new(Semaphore::new(max)),
            readers: Arc::new(Semaphore::new(max - limits.admin_connections)),
            waiting: Arc::new(Semaphore::new(max)),
            identities: Mutex::default(),
            limits,
            wait,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Identity>> {
        self.identities.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for `who`, waiting up to [`PLACE_WAIT`] (or the wait given); for a reader also the semaphore of
    /// its calls in flight. Errors: [`Reason::IdentityCap`] (the reader holds its most
    /// connections), [`Reason::ConnectionCap`] (no place in time).
    pub async fn take(
        self: &Arc<Self>,
        who: Holder<'_>,
    ) -> Result<(Place, Option<Arc<Semaphore>>), Reason> {
        let (hold, calls) = match who {
            Holder::Admin => (None, None),
            Holder::Reader(identity) => {
                let mut ids = self.lock();
                let i = ids.entry(identity.to_string()).or_insert_with(|| Identity {
                    connections: 0,
                    calls: Arc::new(Semaphore::new(self.limits.calls_per_reader)),
                });
                if i.connections >= self.limits.connections_per_reader {
                    return Err(Reason::IdentityCap);
                }
                i.connections += 1;
                let calls = i.calls.clone();
                let hold = IdentityHold {
                    owner: self.clone(),
                    identity: identity.to_string(),
                };
                (Some(hold), Some(calls))
            }
        };
        let reader = hold.is_some();
        let permits = async {
            let r = if reader {
                Some(self.readers.clone().acquire_owned().await.ok()?)
            } else {
                None
            };
            Some((r, self.all.clone().acquire_owned().await.ok()?))
        };
        let free =
            self.all.available_permits() > 0 && (!reader || self.readers.available_permits() > 0);
        let got = if free {
            permits.await
        } else {
            let Ok(_waiting) = self.waiting.clone().try_acquire_owned() else {
                return Err(Reason::ConnectionCap);
            };
            tokio::time::timeout(self.wait, permits)
                .await
                .ok()
                .flatten()
        };
        let (r, all) = got.ok_or(Reason::ConnectionCap)?;
        Ok((
            Place {
                _all: all,
                _reader: r,
                _identity: hold,
            },
            calls,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 4,
            admin_connections: 2,
            connections_per_reader: 2,
            calls_per_reader: 3,
        }
    }

    #[tokio::test]
    async fn readers_never_take_the_admins_places() {
        let p = Places::with_wait(limits(), Duration::from_millis(100));
        let mut held = Vec::new();
        held.push(p.take(Holder::Reader("a")).await.unwrap());
        held.push(p.take(Holder::Reader("a")).await.unwrap());
        // the reader's own cap, refused at once
        assert_eq!(
            p.take(Holder::Reader("a")).await.unwrap_err(),
            Reason::IdentityCap
        );
        // another reader: the reader places (4 - 2) are taken, it waits, then is refused
        assert_eq!(
            p.take(Holder::Reader("b")).await.unwrap_err(),
            Reason::ConnectionCap
        );
        // the admins' reserve is free
        let a1 = p.take(Holder::Admin).await.unwrap();
        let _a2 = p.take(Holder::Admin).await.unwrap();
        // a reader leaving frees its place for the waiting admin
        let waiting = tokio::spawn({
            let p = p.clone();
            async move { p.take(Holder::Admin).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.pop();
        waiting.await.unwrap().unwrap();
        drop(a1);
        // the identity is forgotten once it holds nothing
        held.clear();
        assert!(p.lock().is_empty());
    }
}
