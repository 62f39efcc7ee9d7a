//! The extension's pool of agent channels: one mutual-TLS gRPC channel per agent, reused
//! by every hook that asks that agent, so a rollout's CanUpdateMachine and UpdateMachine
//! polls cost one TCP connection and one TLS handshake per node instead of one per call.
//!
//! A channel is keyed by the agent's address, the TLS server name and a SHA-256 of the CA
//! bundle, client certificate and key as read for this call: a rotated certificate or key
//! gives a new key, so the next call connects with it (the old channel is dropped when it
//! ages out). A tonic [`Channel`] multiplexes concurrent calls over one HTTP/2 connection
//! and reconnects through the same connector after the connection breaks.
//!
//! Bounds: at most [`MAX_CHANNELS`] entries (the least recently used goes first), and an
//! entry unused for [`IDLE`] is dropped (looked for every [`PRUNE_EVERY`]), closing its
//! connection, so memory is the pool's connections (at most [`MAX_CHANNELS`], about
//! 66 KiB each) and the connections of the hooks in flight, nothing per Machine beyond
//! them. A connection to a node that rebooted or vanished without a FIN is found dead by
//! HTTP/2 keep-alive pings ([`KEEPALIVE`], answered within [`KEEPALIVE_TIMEOUT`]) rather
//! than by a hook waiting for its deadline; a call that fails with `UNAVAILABLE` evicts
//! its channel ([`Pool::evict`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use inplace_edge::client::TlsIdentity;

/// Most channels kept (one per agent). An idle pooled connection costs the extension
/// about 66 KiB (rustls client state, h2's 16 KiB write buffer and read buffer, tonic's
/// buffer task and its queue): measured at N = 1000 with the pool bound at 128, 256, 512
/// and 1024, RSS after the hooks 31, 43, 62 and 91 MiB (BENCHMARKS.md, "Issue 28: the
/// extension's memory at N = 1000"). 128 keeps a thousand-Machine rollout under 64 MiB at
/// its peak, not only after it: at N = 1000 (stand-in fleet, 1000 hooks in flight and
/// 1000 kept-alive HTTPS connections) the peak RSS was 69-74 MiB with 256 and 59-63 MiB
/// with 128, with the same p99 (0.7-0.85 s): past the bound every poll costs a handshake
/// either way. Its price is a TLS handshake for an agent that was pushed out: CAPI polls
/// each Machine in UpdateMachine every `retryAfterSeconds` (30 s by default), so with
/// more than 128 Machines in flight at once a poll costs a handshake (about a
/// millisecond of CPU), and a rollout's usual working set (its
/// `maxSurge`/`maxUnavailable` Machines) stays pooled. The least recently used entry goes first; its connection closes when
/// the last hook using it is done (a tonic channel lives as long as a clone of it).
pub(crate) const MAX_CHANNELS: usize = 128;
/// A channel unused this long is closed.
pub(crate) const IDLE: Duration = Duration::from_secs(120);
/// How often idle channels are looked for (and freed memory given back,
/// [`crate::memory::Activity::trim_if_used`]).
pub(crate) const PRUNE_EVERY: Duration = crate::memory::TRIM_EVERY;
/// What a channel is for: address, server name, identity digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    addr: String,
    server_name: String,
    identity: [u8; 32],
}

impl Key {
    /// The key of a connection to `addr` made with `id`.
    pub(crate) fn new(addr: &str, id: &TlsIdentity) -> Key {
        let mut h = Sha256::new();
        for part in [&id.ca, &id.cert, &id.key] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        Key {
            addr: addr.to_string(),
            server_name: id.server_name.clone(),
            identity: h.finalize().into(),
        }
    }
}

/// The pooled channels, each with the time it was last handed out, and the client TLS
/// config of the current identity.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    entries: Mutex<HashMap<Key, (Channel, Instant)>>,
    config: Mutex<Option<([u8; 32], Arc<rustls::ClientConfig>)>>,
}

impl Pool {
    /// The rustls client config of identity `id` (whose digest is in `key`), made once
    /// per identity and shared by every channel made with it: a config per connection
    /// held its own parsed roots, key and TLS session cache (rustls allocates the cache's
    /// 256-entry map with the config), which made the extension's memory grow by that
    /// per agent. A new identity (a rotated certificate or key) replaces it. Errors: the
    /// identity's parts do not parse ([`inplace_edge::client::tls_client_config`]).
    pub(crate) fn client_config(
        &self,
        key: &Key,
        id: &TlsIdentity,
    ) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut c = self.config.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((digest, cfg)) = c.as_ref()
            && *digest == key.identity
        {
            return Ok(cfg.clone());
        }
        let cfg = inplace_edge::client::tls_client_config(id)?;
        *c = Some((key.identity, cfg.clone()));
        Ok(cfg)
    }

    /// A clone of the channel for `key` when one is pooled and not idle past [`IDLE`].
    pub(crate) fn get(&self, key: &Key) -> Option<Channel> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match e.get_mut(key) {
            Some((c, used)) if now.duration_since(*used) < IDLE => {
                *used = now;
                Some(c.clone())
            }
            Some(_) => {
                e.remove(key);
                None
            }
            None => None,
        }
    }

    /// Pools `channel` for `key`, dropping idle entries and, at [`MAX_CHANNELS`], the
    /// least recently used one.
    pub(crate) fn put(&self, key: Key, channel: Channel) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        e.retain(|_, (_, used)| now.duration_since(*used) < IDLE);
        if e.len() >= MAX_CHANNELS
            && !e.contains_key(&key)
            && let Some(oldest) = e
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            e.remove(&oldest);
        }
        e.insert(key, (channel, now));
    }

    /// Drops every channel unused for [`IDLE`], closing its connection (the last clone
    /// of a tonic channel going ends its connection task). Run every [`PRUNE_EVERY`] by
    /// [`crate::extension::Extension::prune_pool`], so an idle channel closes within
    /// `IDLE + PRUNE_EVERY` also when no later hook comes.
    pub(crate) fn prune(&self) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        e.retain(|_, (_, used)| now.duration_since(*used) < IDLE);
    }

    /// Drops the channel for `key` (its connection failed): the next call connects anew.
    pub(crate) fn evict(&self, key: &Key) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.remove(key);
    }

    /// Number of pooled channels (tests check the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cert: &str) -> TlsIdentity {
        TlsIdentity {
            ca: b"ca".to_vec(),
            cert: cert.as_bytes().to_vec(),
            key: b"key".to_vec(),
            server_name: "node-a".into(),
        }
    }

    /// A parseable identity: a CA and a client certificate it signs (PEM).
    fn real_id(cn: &str) -> TlsIdentity {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![cn.to_string()])
            .unwrap()
            .signed_by(&key, &Issuer::from_params(&ca, &ca_key))
            .unwrap();
        TlsIdentity {
            ca: ca_pem.into_bytes(),
            cert: cert.pem().into_bytes(),
            key: key.serialize_pem().into_bytes(),
            server_name: "node-a".into(),
        }
    }

    #[test]
    fn one_client_config_per_identity_for_every_agent() {
        let pool = Pool::default();
        let id = real_id("extension");
        // every agent's channel is made with the one config of the identity
        let a = pool
            .client_config(&Key::new("10.0.0.1:9444", &id), &id)
            .unwrap();
        let other_node = TlsIdentity {
            server_name: "node-b".into(),
            ..id.clone()
        };
        let b = pool
            .client_config(&Key::new("10.0.0.2:9444", &other_node), &other_node)
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        // a rotated certificate gets a config of its own, and replaces the old one
        let rotated = real_id("extension");
        let r = pool
            .client_config(&Key::new("10.0.0.1:9444", &rotated), &rotated)
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &r));
        let again = pool
            .client_config(&Key::new("10.0.0.2:9444", &rotated), &rotated)
            .unwrap();
        assert!(Arc::ptr_eq(&r, &again));
        // an identity that does not parse is an error naming the part
        let broken = TlsIdentity {
            key: b"not a key".to_vec(),
            ..id
        };
        let e = pool
            .client_config(&Key::new("10.0.0.1:9444", &broken), &broken)
            .unwrap_err();
        assert!(format!("{e:#}").contains("client key is not PEM"), "{e:#}");
    }

    #[tokio::test]
    async fn keyed_by_identity_bounded_and_evicted() {
        let ch = || Channel::from_static("http://127.0.0.1:9").connect_lazy();
        let pool = Pool::default();
        let k = Key::new("10.0.0.1:9444", &id("cert-1"));
        assert!(pool.get(&k).is_none());
        pool.put(k.clone(), ch());
        assert!(pool.get(&k).is_some());
        // a rotated certificate is another key: it connects anew
        let rotated = Key::new("10.0.0.1:9444", &id("cert-2"));
        assert_ne!(k, rotated);
        assert!(pool.get(&rotated).is_none());
        // the digest is of the parts, not of their concatenation
        let shifted = TlsIdentity {
            ca: b"cac".to_vec(),
            cert: b"ert-1".to_vec(),
            ..id("")
        };
        assert_ne!(Key::new("10.0.0.1:9444", &shifted), k);
        pool.evict(&k);
        assert!(pool.get(&k).is_none());
        for i in 0..MAX_CHANNELS + 5 {
            pool.put(
                Key::new(&format!("10.0.{}.{}:9444", i / 256, i % 256), &id("c")),
                ch(),
            );
        }
        assert_eq!(pool.len(), MAX_CHANNELS);
        // the first ones put were the least recently used: they went
        assert!(pool.get(&Key::new("10.0.0.0:9444", &id("c"))).is_none());
        let last = MAX_CHANNELS + 4;
        let last = format!("10.0.{}.{}:9444", last / 256, last % 256);
        assert!(pool.get(&Key::new(&last, &id("c"))).is_some());
    }
}
