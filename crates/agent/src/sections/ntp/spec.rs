//! The `ntp` section's part of the NodeSpec: the time sources, validated (each server one
//! host name or address), set by one source only, hashed only when set.

use inplace_wire::names::SpecError;
use inplace_wire::pb;

/// Validated time sources (`ntp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NtpSpec {
    /// NTP servers in order of preference, at least one.
    pub servers: Vec<String>,
}

/// Which source set `ntp` (`ntp`, `dropins[<name>].ntp`), for errors naming both.
pub(crate) type Sources = Option<String>;

fn validate_server(field: &str, s: &str) -> Result<(), SpecError> {
    if s.is_empty() {
        return Err(SpecError::new(
            field,
            "server is empty; give a host name or address such as ntp1.example.com",
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SpecError::new(
            field,
            format!(
                "{s:?} contains whitespace or a control character; give one host name or address"
            ),
        ));
    }
    Ok(())
}

/// Validates the wire `ntp` of one document: None when it is absent or lists no server
/// (the time daemon is then not managed). Errors name `ntp.servers[<i>]`.
pub(crate) fn from_pb(p: Option<&pb::Ntp>) -> Result<Option<NtpSpec>, SpecError> {
    let Some(ntp) = p.filter(|n| !n.servers.is_empty()) else {
        return Ok(None);
    };
    for (i, s) in ntp.servers.iter().enumerate() {
        validate_server(&format!("ntp.servers[{i}]"), s)?;
    }
    Ok(Some(NtpSpec {
        servers: ntp.servers.clone(),
    }))
}

/// Merges the `ntp` of a source found under `prefix` into `spec`: set by two sources is
/// an error naming both, even with the same servers.
pub(crate) fn merge(
    sources: &mut Sources,
    spec: &mut Option<NtpSpec>,
    part: Option<NtpSpec>,
    prefix: &str,
) -> Result<(), SpecError> {
    let Some(ntp) = part else {
        return Ok(());
    };
    let src = format!("{prefix}ntp");
    if let Some(other) = sources {
        return Err(SpecError::new(
            src,
            format!("ntp is already set by {other}; set it once"),
        ));
    }
    *sources = Some(src);
    *spec = Some(ntp);
    Ok(())
}

/// After every source is merged: a `files` item at a path the ntp section writes
/// ([`inplace_formats::ntp::PATHS`]) is an error naming both; `file_source` tells the
/// source of the files item at a path.
pub(crate) fn check_files<'a>(
    sources: &Sources,
    file_source: impl Fn(&str) -> Option<&'a str>,
) -> Result<(), SpecError> {
    let Some(ntp_src) = sources else {
        return Ok(());
    };
    for path in inplace_formats::ntp::PATHS {
        if let Some(src) = file_source(path) {
            return Err(SpecError::new(
                format!("{src}.path"),
                format!(
                    "{path} is written by the ntp section ({ntp_src}); drop the file item or the ntp section"
                ),
            ));
        }
    }
    Ok(())
}

/// The section's part of the canonical hash: `ntp`, the server list, only when set (so
/// the hash of a spec without it is what it always was).
pub(crate) fn hash(ntp: Option<&NtpSpec>, v: &mut serde_json::Map<String, serde_json::Value>) {
    if let Some(ntp) = ntp {
        v.insert("ntp".into(), serde_json::json!(ntp.servers));
    }
}
