//! The program a systemd service runs: the effective `ExecStart=` of a unit file and its
//! drop-ins, per systemd.unit(5) and systemd.service(5). The files are read in systemd's
//! order (the unit file, then the `<unit>.d/*.conf` drop-ins sorted by file name); in
//! the `[Service]` section each `ExecStart=` with a value adds a command and an empty
//! `ExecStart=` clears the list, so for a `Type=simple` service such as the kubelet the
//! last one left is what runs. Lines may continue with a trailing `\`; `#` and `;` start
//! comments; the executable may carry the prefixes `@`, `-`, `:`, `+`, `!`, `!!`.

/// Where the kubelet's program comes from: the executable of the last `ExecStart=` that
/// is in effect, and the file (as named by the caller) that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecStart {
    /// The executable (first word, prefixes removed): `/usr/bin/kubelet`.
    pub program: String,
    /// The file whose `ExecStart=` it is.
    pub file: String,
}

/// The logical lines of a unit file: continuations joined, comments dropped.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in text.trim_start_matches('\u{feff}').lines() {
        let line = raw.trim_end_matches('\r');
        let t = line.trim_start();
        if cur.is_empty() && (t.starts_with('#') || t.starts_with(';')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The executable of an `ExecStart=` value: its first word (unquoted), prefixes removed.
fn program_of(value: &str) -> Option<String> {
    let first = value.split_whitespace().next()?;
    let first = first.trim_matches('"').trim_matches('\'');
    let program = first.trim_start_matches(['@', '-', ':', '+', '!']);
    (!program.is_empty()).then(|| program.to_string())
}

/// The effective `ExecStart=` of `files` (name, text), given in systemd's order; None
/// when none is left in effect.
pub fn effective_exec_start<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<ExecStart> {
    let mut last: Option<ExecStart> = None;
    for (name, text) in files {
        let mut in_service = false;
        for line in logical_lines(text) {
            let t = line.trim();
            if t.starts_with('[') {
                in_service = t == "[Service]";
                continue;
            }
            if !in_service {
                continue;
            }
            let Some((key, value)) = t.split_once('=') else {
                continue;
            };
            if key.trim() != "ExecStart" {
                continue;
            }
            last = program_of(value.trim()).map(|program| ExecStart {
                program,
                file: name.to_string(),
            });
        }
    }
    last
}

/// The words of the effective `ExecStart=` of `files` (same order and rules as
/// [`effective_exec_start`]): (the file that set it, its value split on whitespace with
/// quotes and the executable's prefixes kept as written). `$VAR` references stay words
/// of their own (`$KUBELET_KUBEADM_ARGS`), so a caller sees which literal flags come
/// after which variable. None when none is in effect.
pub fn effective_exec_start_words<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<(String, Vec<String>)> {
    let mut last: Option<(String, Vec<String>)> = None;
    for (name, text) in files {
        let mut in_service = false;
        for line in logical_lines(text) {
            let t = line.trim();
            if t.starts_with('[') {
                in_service = t == "[Service]";
                continue;
            }
            match t.split_once('=') {
                Some((key, value)) if in_service && key.trim() == "ExecStart" => {
                    let words: Vec<String> = value
                        .split_whitespace()
                        .map(|w| w.trim_matches('"').trim_matches('\'').to_string())
                        .collect();
                    last = (!words.is_empty()).then(|| (name.to_string(), words));
                }
                _ => {}
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str =
        "[Unit]\nDescription=kubelet\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\n";
    const KUBEADM: &str = "[Service]\nEnvironment=\"A=b\"\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS \\\n  $KUBELET_EXTRA_ARGS\n";

    #[test]
    fn the_last_exec_start_after_a_reset_wins_in_drop_in_order() {
        let at = |program: &str, file: &str| {
            Some(ExecStart {
                program: program.into(),
                file: file.into(),
            })
        };
        assert_eq!(
            effective_exec_start([("u", UNIT)]),
            at("/usr/bin/kubelet", "u")
        );
        assert_eq!(
            effective_exec_start([("u", UNIT), ("10-kubeadm.conf", KUBEADM)]),
            at("/usr/bin/kubelet", "10-kubeadm.conf")
        );
        let local =
            "[Service]\nExecStart=\n# ExecStart=/nope\nExecStart=-/opt/k8s/bin/kubelet --v=2\n";
        assert_eq!(
            effective_exec_start([
                ("u", UNIT),
                ("10-kubeadm.conf", KUBEADM),
                ("20-local.conf", local)
            ]),
            at("/opt/k8s/bin/kubelet", "20-local.conf")
        );
        // a reset with nothing after it leaves none; outside [Service] is not read
        assert_eq!(
            effective_exec_start([("u", UNIT), ("x", "[Service]\nExecStart=\n")]),
            None
        );
        assert_eq!(
            effective_exec_start([("u", UNIT), ("x", "[Unit]\nExecStart=/x\n")]),
            at("/usr/bin/kubelet", "u")
        );
    }
}
