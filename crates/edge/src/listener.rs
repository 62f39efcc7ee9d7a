//! A mutual-TLS listener's configuration and the identities it admits: the agent's
//! `[api.tcp]` table ([`TcpConfig`]) and the roles and identity kinds of allowlist
//! entries, which the extension's `[[server.clients]]` share.

use serde::Deserialize;

/// What a caller may do, as an allowlist entry grants it (`role = "reader"` or
/// `"admin"`) and as a connection carries it: readers see (coverage, status, operations,
/// watch), admins also change (apply, reboot). Ordered: `Reader < Admin`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, PartialOrd, Ord, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Coverage, status, operations, watch.
    #[default]
    Reader,
    /// Also apply and reboot.
    Admin,
}

/// Which name of a client certificate an allowlist entry is compared with.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IdentityKind {
    /// A URI SAN (SPIFFE IDs: `spiffe://trust-domain/path`).
    Uri,
    /// A DNS SAN.
    Dns,
    /// The subject common name (free text: only for CAs that control it).
    Cn,
}

impl IdentityKind {
    /// The kind of name an allowlist entry `identity` is compared with: `declared` (its
    /// `match` key) when given, else [`IdentityKind::Uri`] when the text has a URI scheme
    /// (RFC 3986 §3.1: a letter, then letters, digits, `+`, `-` or `.`, then `:`) and
    /// [`IdentityKind::Dns`] otherwise. Never [`IdentityKind::Cn`] unless declared: the
    /// subject CN is free text that many issuers let the requester choose (a cert-manager
    /// `Certificate`'s `commonName`), so a CN equal to a URI or DNS entry must not pass for
    /// it.
    pub fn of_entry(identity: &str, declared: Option<IdentityKind>) -> IdentityKind {
        declared.unwrap_or(if has_uri_scheme(identity) {
            IdentityKind::Uri
        } else {
            IdentityKind::Dns
        })
    }

    /// Checks an allowlist entry at config load: `key` names it in the error (e.g.
    /// `api.tcp.clients[0]`). Refused, each with the fix: an empty identity or one with
    /// leading or trailing white space (it could never equal a certificate name); an
    /// identity whose kind is guessed (no `match`) but ambiguous: a scheme without `//`
    /// other than `urn:` (`system:node:edge-1` is a CN, `host:443` no name at all), or an
    /// upper-case scheme (SPIFFE IDs have a lower-case scheme, and a SAN carries it so);
    /// `match = "uri"` on text without a URI scheme; `match = "dns"` (declared or
    /// guessed) on text that is no DNS name (a `:`, `/` or space in it).
    pub fn check_entry(
        key: &str,
        identity: &str,
        declared: Option<IdentityKind>,
    ) -> Result<(), String> {
        if identity.trim().is_empty() {
            return Err(format!(
                "{key}.identity: empty; give the client certificate's URI SAN (spiffe://...), DNS SAN, or a CN with match = \"cn\""
            ));
        }
        if identity.trim() != identity {
            return Err(format!(
                "{key}.identity {identity:?}: leading or trailing white space; no certificate name has it"
            ));
        }
        let kind = IdentityKind::of_entry(identity, declared);
        let guessed = if declared.is_none() { " (taken as" } else { "" };
        match kind {
            IdentityKind::Uri if !has_uri_scheme(identity) => Err(format!(
                "{key}: match = \"uri\" but {identity:?} is no URI (it has no scheme such as spiffe://); fix the identity or the match key"
            )),
            IdentityKind::Uri if declared.is_none() => {
                let (scheme, rest) = identity.split_once(':').unwrap_or_default();
                if scheme.chars().any(|c| c.is_ascii_uppercase()) {
                    Err(format!(
                        "{key}.identity {identity:?}: write the scheme in lower case ({}:...), as certificates carry it",
                        scheme.to_ascii_lowercase()
                    ))
                } else if !rest.starts_with("//") && scheme != "urn" {
                    Err(format!(
                        "{key}.identity {identity:?}{guessed} a URI SAN, from its \"{scheme}:\") has no \"//\": for a subject CN write match = \"cn\"; for a URI SAN without an authority write match = \"uri\""
                    ))
                } else {
                    Ok(())
                }
            }
            IdentityKind::Dns if identity.contains([':', '/', ' ']) => Err(format!(
                "{key}.identity {identity:?}{}: no DNS name (a port, path or space in it); for a subject CN write match = \"cn\"",
                if declared.is_none() {
                    " (taken as a DNS SAN: it has no URI scheme)"
                } else {
                    " (match = \"dns\")"
                }
            )),
            _ => Ok(()),
        }
    }
}

/// Whether `s` starts with a URI scheme and `:` (RFC 3986 §3.1).
fn has_uri_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// One allowlisted client identity.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    /// A URI SAN (`spiffe://...`), DNS SAN or (with `match = "cn"`) subject CN of the
    /// client certificate.
    pub identity: String,
    /// Which name `identity` is compared with (`uri`, `dns` or `cn`). Absent: a URI SAN
    /// when the identity has a URI scheme, else a DNS SAN; a CN only when declared
    /// ([`IdentityKind::of_entry`], [`crate::tls::CertNames::matches`]).
    #[serde(default, rename = "match")]
    pub kind: Option<IdentityKind>,
    /// Its role.
    pub role: Role,
}

/// The remote API over TCP with mutual TLS.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TcpConfig {
    /// Most authenticated connections open at once (default 64): a connection takes a
    /// place only after its TLS handshake, once its certificate is on the allowlist
    /// (`inplace_edge::places`). With every place taken, a new one waits up to 5 s, then
    /// is closed. A handful of management-cluster clients need a few each.
    pub max_connections: usize,
    /// Of `max_connections`, places only admins may take (default 16): readers hold at
    /// most the rest, so no reader can keep an admin out. At most `max_connections`.
    pub admin_connections: usize,
    /// Most connections of one reader identity (an `[[api.tcp.clients]]` entry with
    /// role reader; default 4); one more is refused right after its handshake. Every
    /// certificate the entry matches counts towards it: give each reader client its own
    /// entry, or raise this for readers that share one.
    pub connections_per_reader: usize,
    /// Most calls in flight of one reader identity across its connections (default 16);
    /// one more is answered `RESOURCE_EXHAUSTED`.
    pub calls_per_reader: usize,
    /// Most TLS handshakes pending at once (default 256). Before its handshake a
    /// connection holds no place; when the budget is full a new handshake drops the
    /// oldest of the source holding the most, sources with a handshake older than 1 s
    /// first (`inplace_edge::handshakes`). The ClientHello
    /// must come within 5 s, the handshake end within 10 s.
    pub handshake_budget: usize,
    /// Most TLS handshakes older than 1 s pending from one source, an IPv4 address or an
    /// IPv6 /64 (default 8); a newer one drops that source's oldest (a burst of fresh ones
    /// is kept up to 4 times this). At most `handshake_budget`.
    pub handshakes_per_source: usize,
    /// Address to listen on (`0.0.0.0:9443`); empty = no TCP listener.
    pub listen: String,
    /// Server certificate chain (PEM).
    pub cert: String,
    /// Server private key (PEM).
    pub key: String,
    /// CA bundle that signs client certificates (PEM).
    pub client_ca: String,
    /// Allowlist of client identities and their roles.
    pub clients: Vec<ClientEntry>,
    /// Plain TCP without TLS, allowed only on a loopback address (local testing).
    pub insecure_loopback: bool,
    /// Role of plain loopback callers.
    pub insecure_loopback_role: Role,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_connections: 64,
            admin_connections: 16,
            connections_per_reader: 4,
            calls_per_reader: 16,
            handshake_budget: 256,
            handshakes_per_source: 8,
            listen: String::new(),
            cert: String::new(),
            key: String::new(),
            client_ca: String::new(),
            clients: Vec::new(),
            insecure_loopback: false,
            insecure_loopback_role: Role::default(),
        }
    }
}

impl TcpConfig {
    /// Why the connection limits can not work, naming the key (`api.tcp.<key>: ...`).
    pub fn check_limits(&self) -> Result<(), String> {
        for (key, v) in [
            ("max_connections", self.max_connections),
            ("connections_per_reader", self.connections_per_reader),
            ("calls_per_reader", self.calls_per_reader),
            ("handshake_budget", self.handshake_budget),
            ("handshakes_per_source", self.handshakes_per_source),
        ] {
            if v == 0 {
                return Err(format!(
                    "api.tcp.{key}: must be at least 1 (0 would serve no client)"
                ));
            }
        }
        if self.max_connections > 1 << 20 || self.handshake_budget > 1 << 20 {
            return Err("api.tcp.max_connections and api.tcp.handshake_budget: at most 1048576 each (descriptors)".into());
        }
        if self.admin_connections > self.max_connections {
            return Err(format!(
                "api.tcp.admin_connections: {} is more than api.tcp.max_connections ({}); the admins' reserve is part of it",
                self.admin_connections, self.max_connections
            ));
        }
        if self.handshakes_per_source > self.handshake_budget {
            return Err(format!(
                "api.tcp.handshakes_per_source: {} is more than api.tcp.handshake_budget ({})",
                self.handshakes_per_source, self.handshake_budget
            ));
        }
        Ok(())
    }
}
