//! KubeadmConfig (and Machine / InfraMachine) specs → NodeSpec, unit by unit.
//!
//! The spec of a KubeadmConfig (`bootstrap.cluster.x-k8s.io/v1beta2`, the only version
//! CAPI sends: see [`kubeadm_api_version_problem`]) is read as raw JSON. Every difference
//! between current and desired becomes a [`DiffUnit`]: the JSON location CAPI's patch
//! would copy (lists are atomic, so `spec.files` is one unit), the node changes it needs
//! (agent change ids such as `files[/etc/x]`, `kubelet.flags[max-pods]`, `ntp`), or the
//! reason it can not be applied in place at all. The NodeSpec sent to the node holds
//! only what the KubeadmConfig says, decoded the way cloud-init's `write_files` would.
//!
//! Rules beyond cloud-init's:
//! - Values holding cloud-init Jinja (`{{ ds.meta_data.uuid }}`) are rendered on the node
//!   only: they are never sent to the agent, and a change to one is not covered.
//! - Removing a file or a kubelet argument is not covered: kubeadm and cloud-init only
//!   ever add them, and the node would keep the old one.
//! - `joinConfiguration.discovery` and `initConfiguration.bootstrapTokens` (bootstrap
//!   tokens) are never read: see [`redact`].
//! - Every member of a changed unit is understood or blocks the unit: a member the
//!   translation does not read (a `files[]` or `kubeletExtraArgs[]` entry's, `ntp`'s),
//!   on either side of a changed entry, makes the unit not covered with its JSON pointer
//!   ([`unknown_members`]); copying the list verbatim would pass CAPI's comparison although
//!   the node never acts on it. An entry identical on both sides needs no node action,
//!   whatever it holds, and UpdateMachine leaves an entry with unknown members out of the
//!   NodeSpec (a skipped note) rather than apply a reading of it that may be wrong.
//! - A file at `/etc/inplaced/node.d/<name>.yaml` is a NodeSpec drop-in: it is sent as a
//!   [`pb::DropIn`], which the agent parses and merges (see README, "NodeSpec drop-ins").

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use base64::Engine;
use serde_json::Value;

use super::patch::{Unit, get};

mod schema;
#[cfg(test)]
mod tests;

use inplace_wire::pb;
use schema::unknown_reason;
pub use schema::{
    ARG_FIELDS, FILE_FIELDS, KUBEADM_API_VERSION, NTP_FIELDS, kubeadm_api_version_problem,
    unknown_members,
};

/// One difference between current and desired, and whether it can be applied in place.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffUnit {
    /// The location CAPI's patch copies from desired when the unit is covered.
    pub unit: Unit,
    /// Dotted path for messages (`spec.diskSetup`, `spec.files`).
    pub path: String,
    /// Not covered whatever the node says, with the reason.
    pub blocked: Option<String>,
    /// Agent change ids this unit needs; all must be covered. Empty = no node change.
    pub ids: Vec<String>,
    /// Also answers for agent change ids no unit names (the items of a drop-in).
    pub claims_unknown: bool,
}

impl DiffUnit {
    /// A unit copied whole at `tokens`, not blocked, needing no node change (yet).
    pub fn open(tokens: &[String]) -> DiffUnit {
        DiffUnit {
            path: dotted(tokens),
            unit: Unit::whole(tokens),
            blocked: None,
            ids: vec![],
            claims_unknown: false,
        }
    }

    fn blocked(tokens: &[String], reason: impl Into<String>) -> DiffUnit {
        DiffUnit {
            blocked: Some(reason.into()),
            ..DiffUnit::open(tokens)
        }
    }
}

/// The differences of one object pair and the node changes they need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Analysis {
    /// Differing units, in spec order.
    pub units: Vec<DiffUnit>,
    /// The changed node items (what the node's coverage is asked about).
    pub delta: pb::NodeSpec,
}

fn dotted(tokens: &[String]) -> String {
    let mut s = String::new();
    for t in tokens {
        if t.parse::<usize>().is_ok() {
            s.push_str(&format!("[{t}]"));
        } else {
            if !s.is_empty() {
                s.push('.');
            }
            s.push_str(t);
        }
    }
    s
}

fn toks(root: &[&str], rest: &[&str]) -> Vec<String> {
    root.iter().chain(rest).map(|s| s.to_string()).collect()
}

/// True if `s` holds cloud-init Jinja, which only the node can render.
pub fn has_jinja(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

/// Removes bootstrap secrets from a KubeadmConfig(-Template) object in place:
/// `joinConfiguration.discovery` (bootstrap token, CA hashes, kubeconfig) and
/// `initConfiguration.bootstrapTokens`, under `spec` or `spec.template.spec`. Called on
/// every request before anything reads, logs or forwards the object.
pub fn redact(obj: &mut Value) {
    for root in ["/spec", "/spec/template/spec"] {
        let Some(spec) = obj.pointer_mut(root) else {
            continue;
        };
        if let Some(j) = spec
            .get_mut("joinConfiguration")
            .and_then(Value::as_object_mut)
        {
            j.remove("discovery");
        }
        if let Some(i) = spec
            .get_mut("initConfiguration")
            .and_then(Value::as_object_mut)
        {
            i.remove("bootstrapTokens");
        }
    }
}

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

/// Why a top-level KubeadmConfigSpec field is never applied in place.
fn field_reason(field: &str) -> &'static str {
    match field {
        "diskSetup" => "partitioning and formatting are destructive and never applied in place",
        "mounts" => {
            "mounts are set up by cloud-init at provisioning; changing them in place is not supported"
        }
        "format" | "ignition" => {
            "changes how the machine is provisioned (bootstrap format), which only a new machine can use"
        }
        "bootCommands" => {
            "boot commands are arbitrary commands run by cloud-init; inplaced does not run them"
        }
        "preKubeadmCommands" | "postKubeadmCommands" => {
            "commands that ran once around kubeadm join; inplaced does not re-run arbitrary commands"
        }
        "users" => "users and SSH keys are not applied in place yet",
        "clusterConfiguration" => {
            "control-plane and cluster settings are applied by kubeadm (init/upgrade), not by inplaced"
        }
        "initConfiguration" => "kubeadm reads it only at init",
        "joinConfiguration" => {
            "kubeadm reads it only at join; a running node keeps what join set up"
        }
        _ => "no in-place handler for this field",
    }
}

/// The differing locations under `tokens` (objects recurse; anything else is one unit).
fn diff_paths(
    c: Option<&Value>,
    d: Option<&Value>,
    tokens: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) {
    match (c, d) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            // Keep spec order: desired's keys first, then current-only ones.
            let mut ordered: Vec<&String> = b.keys().collect();
            ordered.extend(a.keys().filter(|k| !b.contains_key(*k)));
            debug_assert_eq!(ordered.len(), keys.len());
            for k in ordered {
                tokens.push(k.clone());
                diff_paths(a.get(k), b.get(k), tokens, out);
                tokens.pop();
            }
        }
        (a, b) if a == b => {}
        _ => out.push(tokens.clone()),
    }
}

/// Analyses a KubeadmConfig spec pair rooted at `root` (`["spec"]`, or
/// `["spec","template","spec"]` for a KubeadmConfigTemplate), both at
/// [`KUBEADM_API_VERSION`].
pub fn kubeadm(current: &Value, desired: &Value, root: &[&str]) -> Analysis {
    let mut out = Analysis::default();
    let cs = get(current, root);
    let ds = get(desired, root);
    // Units with handlers; everything else differing is blocked by field.
    let handled: [&[&str]; 4] = [
        &["files"],
        &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
        &["ntp"],
        &["verbosity"],
    ];
    let mut paths = Vec::new();
    diff_paths(
        cs,
        ds,
        &mut root.iter().map(|s| s.to_string()).collect(),
        &mut paths,
    );
    let mut seen_handled = BTreeSet::new();
    let mut blocked_top = BTreeSet::new();
    for p in paths {
        let rel: Vec<&str> = p[root.len()..].iter().map(String::as_str).collect();
        if let Some(h) = handled.iter().find(|h| rel.starts_with(h)) {
            if seen_handled.insert(h.to_vec()) {
                match h[0] {
                    "files" => files(current, desired, root, &mut out),
                    "ntp" => ntp(current, desired, root, &mut out),
                    "verbosity" => out.units.push(DiffUnit::open(&toks(root, h))),
                    _ => kubelet_args(current, desired, root, &mut out),
                }
            }
            continue;
        }
        let Some(top) = rel.first() else {
            out.units.push(DiffUnit::blocked(
                &p,
                "the bootstrap config spec was added or removed",
            ));
            continue;
        };
        // Whole-field reasons for top-level fields; join/init/cluster configuration are
        // reported at the deepest differing member so the message is precise.
        if matches!(
            *top,
            "joinConfiguration" | "initConfiguration" | "clusterConfiguration"
        ) {
            out.units.push(DiffUnit::blocked(&p, field_reason(top)));
        } else if blocked_top.insert(top.to_string()) {
            out.units
                .push(DiffUnit::blocked(&toks(root, &[top]), field_reason(top)));
        }
    }
    out
}

fn str_of<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
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

fn decode_file_inner(f: &Value, budget: &mut DecodeBudget) -> Result<NodeFile, String> {
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
    let path = str_of(f, "path").ok_or("path is missing")?.to_string();
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
    let raw = str_of(f, "content").unwrap_or("");
    let b64 = |s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s.split_whitespace().collect::<String>())
            // No detail: the decoder's message quotes a byte of the content.
            .map_err(|_| "content is not valid base64".to_string())
    };
    // A gzip bomb (1 MB of request for 1 GB of zeros) must not be inflated whole: stop one
    // byte past the limit the agents apply to a file anyway, or past what is left of the
    // config's budget, whichever is less.
    let left = budget.left;
    let over_budget = |budget: &mut DecodeBudget| {
        budget.exceeded = true;
        over_config_budget()
    };
    let gunzip = |b: &[u8], budget: &mut DecodeBudget| {
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
    if content.len() as u64 > left {
        return Err(over_budget(budget));
    }
    if has_jinja(&String::from_utf8_lossy(&content)) {
        return Err("content holds cloud-init Jinja ({{ ... }}), which only the node renders at provisioning".into());
    }
    let mode = match str_of(f, "permissions") {
        None | Some("") => None,
        Some(p) => Some(
            u32::from_str_radix(p.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    format!("permissions {p:?} is not an octal mode such as \"0644\"")
                })?,
        ),
    };
    if let Some(name) = path
        .strip_prefix(inplace_wire::names::DROPIN_DIR)
        .and_then(|r| r.strip_prefix('/'))
    {
        inplace_wire::names::validate_dropin_name("name", name)
            .map_err(|e| format!("not a NodeSpec drop-in: {}", e.message))?;
        // The agent keeps node.d files 0644 root:root; other metadata would change at the
        // first in-place update.
        let owner = str_of(f, "owner").unwrap_or("");
        if !matches!(owner, "" | "root" | "root:root" | "0:0")
            || !matches!(mode, None | Some(0o644))
        {
            return Err("a NodeSpec drop-in is kept 0644 root:root by the agent; give those permissions and owner (or none)".into());
        }
        let content = String::from_utf8(content)
            .map_err(|_| "a NodeSpec drop-in must be UTF-8 YAML".to_string())?;
        return Ok(NodeFile::DropIn(pb::DropIn {
            name: name.to_string(),
            content,
            keep: false,
        }));
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

/// The drop-in name of a `files` entry under `/etc/inplaced/node.d` with a valid name.
fn kept_dropin(f: &Value) -> Option<String> {
    let name = str_of(f, "path")?
        .strip_prefix(inplace_wire::names::DROPIN_DIR)?
        .strip_prefix('/')?;
    inplace_wire::names::validate_dropin_name("name", name).ok()?;
    Some(name.to_string())
}

/// Agent change ids a drop-in's items produce (best effort; unknown ids are claimed by
/// the `files` unit anyway).
fn dropin_ids(d: &pb::DropIn) -> Vec<String> {
    let mut ids = vec![format!("dropins[{}]", d.name)];
    if let Ok(s) = inplace_wire::yaml::parse(&d.content) {
        ids.extend(s.files.iter().map(|f| format!("files[{}]", f.path)));
        ids.extend(s.sysctls.keys().map(|k| format!("sysctls[{k}]")));
        if let Some(k) = &s.kubelet {
            ids.extend(k.flags.keys().map(|n| format!("kubelet.flags[{n}]")));
        }
        if s.ntp.is_some() {
            ids.push("ntp".into());
        }
    }
    ids
}

fn files(current: &Value, desired: &Value, root: &[&str], out: &mut Analysis) {
    let tokens = toks(root, &["files"]);
    let list = |v: &Value| {
        get(v, &tokens)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (cur, des) = (list(current), list(desired));
    let mut u = DiffUnit::open(&tokens);
    let mut reasons = Vec::new();
    let mut seen = BTreeSet::new();
    let mut budget = DecodeBudget::default();
    for (i, f) in des.iter().enumerate() {
        let path = str_of(f, "path").unwrap_or("");
        if !seen.insert(path.to_string()) {
            reasons.push(format!("spec.files[{i}] repeats path {path}"));
            continue;
        }
        let before = cur
            .iter()
            .enumerate()
            .find(|(_, c)| str_of(c, "path") == Some(path));
        if before.map(|(_, c)| c) == Some(f) {
            // unchanged, but its bytes count toward the config's total all the same, as
            // UpdateMachine decodes every file (the content is dropped at once)
            if !budget.exceeded
                && let Err(e) = decode_file_within(f, &mut budget)
                && budget.exceeded
            {
                reasons.push(format!("{path}: {e}"));
            }
            continue;
        }
        let at = |j: usize| {
            let mut t = tokens.clone();
            t.push(j.to_string());
            t
        };
        let mut unknown = unknown_members(f, &FILE_FIELDS, &at(i));
        if let Some((j, c)) = before {
            unknown.extend(unknown_members(c, &FILE_FIELDS, &at(j)));
        }
        if let Some(r) = unknown_reason("File", &unknown) {
            reasons.push(format!("{path}: {r}"));
            continue;
        }
        match decode_file_within(f, &mut budget) {
            Ok(NodeFile::File(pf)) => {
                u.ids.push(format!("files[{}]", pf.path));
                out.delta.files.push(pf);
            }
            Ok(NodeFile::DropIn(d)) => {
                u.ids.extend(dropin_ids(&d));
                u.claims_unknown = true;
                out.delta.dropins.push(d);
            }
            Err(e) => reasons.push(format!("{path}: {e}")),
        }
    }
    for c in &cur {
        let path = str_of(c, "path").unwrap_or("");
        if !des.iter().any(|d| str_of(d, "path") == Some(path)) {
            reasons.push(format!("{path} is no longer listed, but removing a file is not applied in place (the node would keep it)"));
        }
    }
    if !reasons.is_empty() {
        u.blocked = Some(reasons.join("; "));
    }
    out.units.push(u);
}

/// `kubeletExtraArgs` (a v1beta2 list of `{name, value}`; `value` may be omitted) as
/// name → value. Errors name a repeated argument, a member that is not a string, and the
/// v1beta1 map shape, which CAPI never sends (see [`kubeadm_api_version_problem`]).
pub fn kubelet_args_of(v: Option<&Value>) -> Result<BTreeMap<String, String>, String> {
    let mut m = BTreeMap::new();
    match v {
        Some(Value::Array(a)) => {
            for (i, e) in a.iter().enumerate() {
                let (Some(name), Some(value)) = (
                    str_of(e, "name"),
                    e.get("value").map_or(Some(""), Value::as_str),
                ) else {
                    return Err(format!(
                        "kubeletExtraArgs[{i}]: name and value must be strings"
                    ));
                };
                let (name, value) = (name.to_string(), value.to_string());
                if m.insert(name.clone(), value).is_some() {
                    return Err(format!("kubeletExtraArgs lists {name} twice"));
                }
            }
        }
        Some(Value::Object(_)) => {
            return Err(format!(
                "kubeletExtraArgs is a map (the v1beta1 shape); at {KUBEADM_API_VERSION} it is a list of {{name, value}}"
            ));
        }
        None | Some(Value::Null) => {}
        Some(_) => return Err("kubeletExtraArgs must be a list of {name, value}".into()),
    }
    Ok(m)
}

/// Pointers of the unknown members of the `kubeletExtraArgs` entries of `list` (at
/// `tokens`) that are not identical to an entry of `other`.
fn changed_arg_unknowns(
    list: Option<&Value>,
    other: Option<&Value>,
    tokens: &[String],
) -> Vec<String> {
    let empty = vec![];
    let others = other.and_then(Value::as_array).unwrap_or(&empty);
    let mut out = Vec::new();
    for (i, e) in list
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .enumerate()
    {
        if others.contains(e) {
            continue;
        }
        let mut t = tokens.to_vec();
        t.push(i.to_string());
        out.extend(unknown_members(e, &ARG_FIELDS, &t));
    }
    out
}

fn kubelet_args(current: &Value, desired: &Value, root: &[&str], out: &mut Analysis) {
    let tokens = toks(
        root,
        &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
    );
    let (cv, dv) = (get(current, &tokens), get(desired, &tokens));
    let mut unknown = changed_arg_unknowns(dv, cv, &tokens);
    unknown.extend(changed_arg_unknowns(cv, dv, &tokens));
    if let Some(r) = unknown_reason("Arg", &unknown) {
        out.units.push(DiffUnit::blocked(&tokens, r));
        return;
    }
    let (c, d) = match (kubelet_args_of(cv), kubelet_args_of(dv)) {
        (Ok(c), Ok(d)) => (c, d),
        (Err(e), _) | (_, Err(e)) => {
            out.units.push(DiffUnit::blocked(&tokens, e));
            return;
        }
    };
    let names: BTreeSet<&String> = c.keys().chain(d.keys()).collect();
    let mut whole = DiffUnit::open(&tokens);
    let mut reasons = Vec::new();
    let flags = &mut out.delta.kubelet.get_or_insert_with(Default::default).flags;
    for n in names {
        let (before, after) = (c.get(n), d.get(n));
        if before == after {
            continue;
        }
        let reason = match (before, after) {
            (Some(_), None) => Some(format!(
                "removing kubelet argument {n} is not applied in place (kubeadm-flags.env would keep it)"
            )),
            (_, Some(v)) if has_jinja(v) || before.is_some_and(|b| has_jinja(b)) => Some(format!(
                "kubelet argument {n} holds cloud-init Jinja, which only the node renders at provisioning"
            )),
            _ => None,
        };
        if reason.is_none() {
            flags.insert(n.clone(), after.cloned().unwrap_or_default());
        }
        whole.ids.push(format!("kubelet.flags[{n}]"));
        reasons.extend(reason);
    }
    if out
        .delta
        .kubelet
        .as_ref()
        .is_some_and(|k| k.flags.is_empty() && k.config.is_none())
    {
        out.delta.kubelet = None;
    }
    if !reasons.is_empty() {
        whole.blocked = Some(reasons.join("; "));
    }
    out.units.push(whole);
}

/// The NodeSpec `ntp` for a KubeadmConfig `ntp` value, or why it can not be applied.
/// `None` = nothing to manage (ntp absent or disabled).
fn ntp_of(v: Option<&Value>) -> Result<Option<pb::Ntp>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if !v.is_object() {
        return Err("ntp must be an object with servers and enabled".into());
    }
    if v.get("enabled")
        .is_some_and(|e| !e.is_boolean() && !e.is_null())
    {
        return Err("ntp.enabled must be a boolean".into());
    }
    if v.get("enabled").and_then(Value::as_bool) == Some(false) {
        return Ok(None);
    }
    let mut servers = Vec::new();
    match v.get("servers") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, s) in a.iter().enumerate() {
                let s = s
                    .as_str()
                    .ok_or_else(|| format!("ntp.servers[{i}] must be a string"))?;
                servers.push(s.to_string());
            }
        }
        Some(_) => return Err("ntp.servers must be a list of strings".into()),
    }
    if servers.is_empty() {
        return Err("ntp without servers means the distribution's default pools, which the agent does not know".into());
    }
    Ok(Some(pb::Ntp { servers }))
}

fn ntp(current: &Value, desired: &Value, root: &[&str], out: &mut Analysis) {
    let tokens = toks(root, &["ntp"]);
    let mut u = DiffUnit {
        ids: vec!["ntp".into()],
        ..DiffUnit::open(&tokens)
    };
    let (cv, dv) = (get(current, &tokens), get(desired, &tokens));
    let mut unknown = Vec::new();
    for v in [dv, cv].into_iter().flatten() {
        unknown.extend(unknown_members(v, &NTP_FIELDS, &tokens));
    }
    if let Some(r) = unknown_reason("NTP", &unknown) {
        u.blocked = Some(r);
        out.units.push(u);
        return;
    }
    let before = ntp_of(cv).ok().flatten();
    match ntp_of(dv) {
        Ok(Some(n)) => out.delta.ntp = Some(n),
        Ok(None) if before.is_some() => {
            u.blocked = Some("removing ntp (or turning it off) would leave the configured servers in place; the agent can not restore the image's defaults".into())
        }
        Ok(None) => u.ids.clear(),
        Err(e) => u.blocked = Some(e),
    }
    out.units.push(u);
}

/// The full NodeSpec a desired KubeadmConfig asks for (for UpdateMachine, which has no
/// current): every file and kubelet argument and ntp, minus what only the node can render
/// (Jinja) or what was never in-place material (append, contentFrom, Template). Those are
/// returned as skipped notes; CanUpdate already refused any change to them.
pub fn node_spec(desired: &Value, root: &[&str]) -> (pb::NodeSpec, Vec<String>) {
    let (spec, skipped, _) = node_spec_within(desired, root);
    (spec, skipped)
}

/// [`node_spec`], or [`over_config_budget`] when the files decode to more than
/// [`MAX_DECODED_CONFIG_BYTES`] together (UpdateMachine refuses such a spec rather than
/// apply it without some of its files).
pub fn node_spec_checked(
    desired: &Value,
    root: &[&str],
) -> Result<(pb::NodeSpec, Vec<String>), String> {
    match node_spec_within(desired, root) {
        (_, _, true) => Err(over_config_budget()),
        (spec, skipped, false) => Ok((spec, skipped)),
    }
}

/// [`node_spec`] and whether the files went over [`MAX_DECODED_CONFIG_BYTES`].
fn node_spec_within(desired: &Value, root: &[&str]) -> (pb::NodeSpec, Vec<String>, bool) {
    let mut spec = pb::NodeSpec::default();
    let mut skipped = Vec::new();
    let files_t = toks(root, &["files"]);
    let mut budget = DecodeBudget::default();
    if let Some(list) = get(desired, &files_t).and_then(Value::as_array) {
        for (i, f) in list.iter().enumerate() {
            let mut at = files_t.clone();
            at.push(i.to_string());
            let decoded = match unknown_reason("File", &unknown_members(f, &FILE_FIELDS, &at)) {
                Some(r) => Err(r),
                None if budget.exceeded => Err(over_config_budget()),
                None => decode_file_within(f, &mut budget),
            };
            match decoded {
                Ok(NodeFile::File(pf)) => spec.files.push(pf),
                Ok(NodeFile::DropIn(d)) => spec.dropins.push(d),
                // A drop-in only the node has rendered (Jinja, a Secret): the agent keeps
                // its copy, which it may have applied at start-up; leaving it out would
                // revert it.
                Err(e) => match kept_dropin(f) {
                    Some(name) => {
                        skipped.push(format!("{name}: the node's copy is kept ({e})"));
                        spec.dropins.push(pb::DropIn {
                            name,
                            content: String::new(),
                            keep: true,
                        });
                    }
                    None => skipped.push(format!("{}: {e}", str_of(f, "path").unwrap_or("?"))),
                },
            }
        }
    }
    let args_t = toks(
        root,
        &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
    );
    let args_v = get(desired, &args_t);
    let unknown = changed_arg_unknowns(args_v, None, &args_t);
    let unread: BTreeSet<&str> = args_v
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| {
            e.as_object()
                .is_some_and(|m| m.keys().any(|k| !ARG_FIELDS.contains(&k.as_str())))
        })
        .filter_map(|e| str_of(e, "name"))
        .collect();
    if let Some(r) = unknown_reason("Arg", &unknown) {
        skipped.push(format!("kubeletExtraArgs: {r}"));
    }
    match kubelet_args_of(args_v) {
        Ok(args) => {
            let mut flags = BTreeMap::new();
            for (n, v) in args {
                if unread.contains(n.as_str()) {
                    continue;
                }
                if has_jinja(&v) {
                    skipped.push(format!("kubelet argument {n}: rendered on the node"));
                } else {
                    flags.insert(n, v);
                }
            }
            if !flags.is_empty() {
                spec.kubelet = Some(pb::Kubelet {
                    config: None,
                    flags,
                });
            }
        }
        Err(e) => skipped.push(e),
    }
    let ntp_t = toks(root, &["ntp"]);
    let ntp_v = get(desired, &ntp_t);
    match unknown_reason(
        "NTP",
        &ntp_v.map_or(vec![], |v| unknown_members(v, &NTP_FIELDS, &ntp_t)),
    ) {
        Some(r) => skipped.push(format!("ntp: {r}")),
        None => match ntp_of(ntp_v) {
            Ok(n) => spec.ntp = n,
            Err(e) => skipped.push(format!("ntp: {e}")),
        },
    }
    (spec, skipped, budget.exceeded)
}

/// Machine spec fields CAPI zeroes before comparing (`CleanupMachineSpecForDiff`).
const MACHINE_IGNORED: [&str; 8] = [
    "clusterName",
    "bootstrap",
    "infrastructureRef",
    "providerID",
    "minReadySeconds",
    "readinessGates",
    "deletion",
    "taints",
];

/// Differences of a Machine spec (`root` = `["spec"]`) or a MachineSet's machine
/// template (`["spec","template","spec"]`), after CAPI's clean-up. Only `version` can be
/// applied in place (see [`version_unit`]); the others are blocked.
pub fn machine(current: &Value, desired: &Value, root: &[&str]) -> Vec<DiffUnit> {
    let clean = |v: &Value| {
        let mut s = get(v, root).cloned().unwrap_or(Value::Null);
        if let Some(m) = s.as_object_mut() {
            for k in MACHINE_IGNORED {
                m.remove(k);
            }
        }
        s
    };
    let mut paths = Vec::new();
    diff_paths(
        Some(&clean(current)),
        Some(&clean(desired)),
        &mut vec![],
        &mut paths,
    );
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in paths {
        let top = p.first().cloned().unwrap_or_default();
        if !seen.insert(top.clone()) {
            continue;
        }
        if top == "version" {
            out.push(version_unit(current, desired, root));
            continue;
        }
        let reason = match top.as_str() {
            "failureDomain" => "moving the Machine to another failure domain needs another host",
            _ => "no in-place handler for this Machine field",
        };
        out.push(DiffUnit::blocked(&toks(root, &[&top]), reason));
    }
    out
}

/// The agent change id of a Kubernetes version change.
pub const VERSION_ID: &str = "kubernetes.version";

/// The unit of a `version` change (Machine `spec.version`, MachineSet
/// `spec.template.spec.version`): copied verbatim, covered when the node covers
/// `kubernetes.version`. Blocked when the desired version is not a release version, and
/// for a MachineSet (whose Machines' nodes are not asked) when the version skew policy
/// forbids the step from the template's current version.
fn version_unit(current: &Value, desired: &Value, root: &[&str]) -> DiffUnit {
    let t = toks(root, &["version"]);
    let ver = |v: &Value| {
        get(v, &t)
            .and_then(Value::as_str)
            .map(inplace_wire::k8s_version::Version::parse)
    };
    let unit = DiffUnit {
        ids: vec![VERSION_ID.to_string()],
        ..DiffUnit::open(&t)
    };
    match (ver(current), ver(desired)) {
        (_, None) => DiffUnit::blocked(&t, "the desired version is removed"),
        (_, Some(Err(e))) => DiffUnit::blocked(&t, e),
        (Some(Ok(from)), Some(Ok(to))) if root.len() > 1 => {
            match inplace_wire::k8s_version::skew(from, to, false) {
                Ok(_) => unit,
                Err(e) => DiffUnit::blocked(&t, e),
            }
        }
        _ => unit,
    }
}

/// The desired version when `version` differs: what the node's coverage is asked about.
pub fn version_delta(current: &Value, desired: &Value, root: &[&str]) -> Option<pb::Kubernetes> {
    let t = toks(root, &["version"]);
    let d = get(desired, &t).and_then(Value::as_str)?;
    (get(current, &t).and_then(Value::as_str) != Some(d)).then(|| pb::Kubernetes {
        version: d.to_string(),
    })
}

/// Differences of an InfraMachine spec (or template spec): re-provisioning material
/// (image, host selection, network data), never applied in place.
pub fn infrastructure(current: &Value, desired: &Value, root: &[&str]) -> Vec<DiffUnit> {
    let kind = str_of(desired, "kind")
        .unwrap_or("InfraMachine")
        .to_string();
    let mut paths = Vec::new();
    diff_paths(
        get(current, root),
        get(desired, root),
        &mut root.iter().map(|s| s.to_string()).collect(),
        &mut paths,
    );
    paths
        .into_iter()
        .map(|p| {
            DiffUnit::blocked(
                &p,
                format!("{kind} changes (image, host, network) need re-provisioning"),
            )
        })
        .collect()
}
