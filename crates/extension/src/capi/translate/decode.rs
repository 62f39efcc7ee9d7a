//! `files[]` entries decoded the way cloud-init's `write_files` would (base64, gzip),
//! within the decoded-bytes budget of one bootstrap config.

use std::io::Read;

use base64::Engine;
use serde_json::Value;

use super::{has_jinja, str_of};
use inplace_wire::pb;

/// Largest decompressed `files[].content` the extension inflates (16 MiB, the agents'
/// default `policy.max_file_bytes`); a larger one is not covered, and is never inflated
/// past this bound.
pub const MAX_DECODED_FILE_BYTES: u64 = 16 << 20;

/// Most decoded bytes (inflated, base64-decoded or plain) of all `files` of one bootstrap
/// config together (16 MiB: one file of [`MAX_DECODED_FILE_BYTES`], or many smaller). A
/// gzip bomb is about 1000:1, so a 181 KB request of files each under the per-file bound
/// inflated to 534 MB before there was a total; inflation stops one byte past what is
/// left of this budget, never after. Over it, the files are not covered (CanUpdate) and
/// UpdateMachine refuses the spec; both name the limit.
pub const MAX_DECODED_CONFIG_BYTES: u64 = 16 << 20;

/// What is left of [`MAX_DECODED_CONFIG_BYTES`] while the files of one bootstrap config
/// are decoded ([`decode_file_within`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeBudget {
    left: u64,
    /// True once a file did not fit.
    pub exceeded: bool,
}

impl Default for DecodeBudget {
    fn default() -> Self {
        DecodeBudget {
            left: MAX_DECODED_CONFIG_BYTES,
            exceeded: false,
        }
    }
}

/// The reason a file is not decoded once the files before it took the budget.
pub fn over_config_budget() -> String {
    format!(
        "the files of this bootstrap config decode to more than {MAX_DECODED_CONFIG_BYTES} bytes in all (the extension's limit of decoded content per bootstrap config); put large content on the node another way"
    )
}

/// A KubeadmConfig `files` entry decoded for the node, or why it can not be.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFile {
    /// An ordinary file.
    File(pb::File),
    /// A NodeSpec drop-in (`/etc/inplaced/node.d/*.yaml`).
    DropIn(pb::DropIn),
}

/// Decodes one `files` entry the way cloud-init's `write_files` would: `encoding`
/// `base64`, `gzip`/`gz`, `gzip+base64`/`gz+base64`/`gz+b64`; `permissions` an octal
/// string (default 0644); `owner` `user[:group]` (default root). Errors are the reason the
/// entry is not applied in place.
pub fn decode_file(f: &Value) -> Result<NodeFile, String> {
    decode_file_within(f, &mut DecodeBudget::default())
}

/// [`decode_file`], taking the decoded bytes from `budget` (shared by the files of one
/// bootstrap config): gzip is inflated at most one byte past what is left, and a file
/// that does not fit is refused with [`over_config_budget`] (`budget.exceeded` is set).
pub fn decode_file_within(f: &Value, budget: &mut DecodeBudget) -> Result<NodeFile, String> {
    if budget.exceeded {
        return Err(over_config_budget());
    }
    let r = decode_file_inner(f, budget);
    if let Ok(NodeFile::File(pf)) = &r {
        budget.left -= pf.content.len() as u64;
    } else if let Ok(NodeFile::DropIn(d)) = &r {
        budget.left -= d.content.len() as u64;
    }
    r
}

/// [`decode_file_within`] without the budget's accounting: the entry's checks in order
/// (member types, what cloud-init alone could do, the content, the mode), then the file
/// or drop-in.
fn decode_file_inner(f: &Value, budget: &mut DecodeBudget) -> Result<NodeFile, String> {
    check_member_types(f)?;
    let path = str_of(f, "path").ok_or("path is missing")?.to_string();
    refuse_provisioning_only(f)?;
    let content = decode_content(f, budget)?;
    if has_jinja(&String::from_utf8_lossy(&content)) {
        return Err("content holds cloud-init Jinja ({{ ... }}), which only the node renders at provisioning".into());
    }
    let mode = mode_of(f)?;
    if let Some(name) = path
        .strip_prefix(inplace_wire::names::DROPIN_DIR)
        .and_then(|r| r.strip_prefix('/'))
    {
        return dropin(name, f, mode, content);
    }
    let owner = str_of(f, "owner").unwrap_or("").to_string();
    Ok(NodeFile::File(pb::File {
        path,
        content,
        mode,
        owner,
        group: String::new(),
    }))
}

/// The members read as strings are strings (or null), `append` a boolean (or null).
fn check_member_types(f: &Value) -> Result<(), String> {
    for key in [
        "path",
        "owner",
        "permissions",
        "encoding",
        "content",
        "contentFormat",
    ] {
        if f.get(key).is_some_and(|v| !v.is_string() && !v.is_null()) {
            return Err(format!("{key} must be a string"));
        }
    }
    if f.get("append")
        .is_some_and(|v| !v.is_boolean() && !v.is_null())
    {
        return Err("append must be a boolean".into());
    }
    Ok(())
}

/// Refuses what only provisioning can do: content from a Secret, a Template to render,
/// content appended to what the image had.
fn refuse_provisioning_only(f: &Value) -> Result<(), String> {
    if let Some(cf) = f.get("contentFrom") {
        let s = cf.get("secret").unwrap_or(cf);
        return Err(format!(
            "content comes from Secret {}/{}, which only the management cluster can read; this extension does not resolve Secrets",
            str_of(s, "name").unwrap_or("?"),
            str_of(s, "key").unwrap_or("?")
        ));
    }
    if str_of(f, "contentFormat").is_some_and(|s| s != "Raw" && !s.is_empty()) {
        return Err(
            "contentFormat Template is rendered by the bootstrap provider, not in place".into(),
        );
    }
    if f.get("append").and_then(Value::as_bool) == Some(true) {
        return Err("append: cloud-init appended this content at provisioning; a rewrite in place can not reproduce that".into());
    }
    Ok(())
}

/// The entry's content decoded by its `encoding`, within what is left of `budget` (which
/// is marked exceeded when it does not fit).
fn decode_content(f: &Value, budget: &mut DecodeBudget) -> Result<Vec<u8>, String> {
    let raw = str_of(f, "content").unwrap_or("");
    let b64 = |s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s.split_whitespace().collect::<String>())
            // No detail: the decoder's message quotes a byte of the content.
            .map_err(|_| "content is not valid base64".to_string())
    };
    let content = match str_of(f, "encoding").unwrap_or("") {
        "" | "text/plain" => raw.as_bytes().to_vec(),
        "base64" | "b64" => b64(raw)?,
        "gzip" | "gz" => gunzip(raw.as_bytes(), budget)?,
        "gzip+base64" | "gz+base64" | "gz+b64" | "gzip+b64" => gunzip(&b64(raw)?, budget)?,
        other => {
            return Err(format!(
                "encoding {other:?} is not one cloud-init knows (base64, gzip, gzip+base64)"
            ));
        }
    };
    if content.len() as u64 > budget.left {
        return Err(over_budget(budget));
    }
    Ok(content)
}

/// Marks `budget` exceeded; the reason.
fn over_budget(budget: &mut DecodeBudget) -> String {
    budget.exceeded = true;
    over_config_budget()
}

/// Inflates gzip `b`. A gzip bomb (1 MB of request for 1 GB of zeros) must not be
/// inflated whole: it stops one byte past the limit the agents apply to a file anyway
/// ([`MAX_DECODED_FILE_BYTES`]), or past what is left of the config's budget, whichever
/// is less.
fn gunzip(b: &[u8], budget: &mut DecodeBudget) -> Result<Vec<u8>, String> {
    let left = budget.left;
    let mut out = Vec::new();
    let bound = MAX_DECODED_FILE_BYTES.min(left);
    flate2::read::GzDecoder::new(b)
        .take(bound + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("content is not valid gzip ({e})"))?;
    if out.len() as u64 > MAX_DECODED_FILE_BYTES {
        return Err(format!(
            "content decompresses to more than {MAX_DECODED_FILE_BYTES} bytes (the agents' default policy.max_file_bytes)"
        ));
    }
    if out.len() as u64 > left {
        return Err(over_budget(budget));
    }
    Ok(out)
}

/// `permissions`: an octal mode (`0644`, `0o644`, at most `07777`), or none.
fn mode_of(f: &Value) -> Result<Option<u32>, String> {
    match str_of(f, "permissions") {
        None | Some("") => Ok(None),
        Some(p) => u32::from_str_radix(p.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .map(Some)
            .ok_or_else(|| format!("permissions {p:?} is not an octal mode such as \"0644\"")),
    }
}

/// The NodeSpec drop-in `name` (a file under `/etc/inplaced/node.d`): a valid name, kept
/// 0644 root:root, UTF-8.
fn dropin(name: &str, f: &Value, mode: Option<u32>, content: Vec<u8>) -> Result<NodeFile, String> {
    inplace_wire::names::validate_dropin_name("name", name)
        .map_err(|e| format!("not a NodeSpec drop-in: {}", e.message))?;
    // The agent keeps node.d files 0644 root:root; other metadata would change at the
    // first in-place update.
    let owner = str_of(f, "owner").unwrap_or("");
    if !matches!(owner, "" | "root" | "root:root" | "0:0") || !matches!(mode, None | Some(0o644)) {
        return Err("a NodeSpec drop-in is kept 0644 root:root by the agent; give those permissions and owner (or none)".into());
    }
    let content = String::from_utf8(content)
        .map_err(|_| "a NodeSpec drop-in must be UTF-8 YAML".to_string())?;
    Ok(NodeFile::DropIn(pb::DropIn {
        name: name.to_string(),
        content,
        keep: false,
    }))
}

/// The drop-in name of a `files` entry under `/etc/inplaced/node.d` with a valid name.
pub(super) fn kept_dropin(f: &Value) -> Option<String> {
    let name = str_of(f, "path")?
        .strip_prefix(inplace_wire::names::DROPIN_DIR)?
        .strip_prefix('/')?;
    inplace_wire::names::validate_dropin_name("name", name).ok()?;
    Some(name.to_string())
}
