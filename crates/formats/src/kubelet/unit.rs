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
    numbered_lines(text).into_iter().map(|(_, l)| l).collect()
}

/// [`logical_lines`] with the 1-based number of the physical line each starts on.
fn numbered_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (i, raw) in text.trim_start_matches('\u{feff}').lines().enumerate() {
        let line = raw.trim_end_matches('\r');
        let t = line.trim_start();
        if cur.is_empty() && (t.starts_with('#') || t.starts_with(';')) {
            continue;
        }
        if cur.is_empty() {
            start = i + 1;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                out.push((start, std::mem::take(&mut cur)));
            }
        }
    }
    if !cur.is_empty() {
        out.push((start, cur));
    }
    out
}

/// Where a value of the service's environment is set: the file, the 1-based line, and
/// the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSetting {
    /// The unit file, drop-in or environment file.
    pub file: String,
    /// 1-based line of the assignment (of a continued line, its first line).
    pub line: usize,
    /// The value as the service gets it.
    pub value: String,
}

/// One `EnvironmentFile=` of the service, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFileRef {
    /// The environment file's path.
    pub path: String,
    /// Written `EnvironmentFile=-path`: a missing file is not an error.
    pub optional: bool,
}

/// The `[Service]` section's `Environment=` and `EnvironmentFile=` settings of a unit and
/// its drop-ins, per systemd.exec(5): `Environment=` assignments in order (a later one of
/// a variable wins, an empty `Environment=` resets the list), `EnvironmentFile=` files in
/// order (an empty one resets the list). The files are read when the service starts and
/// override `Environment=`; a later file wins over an earlier one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceEnv {
    /// `Environment=` variables: name → where and what.
    pub vars: std::collections::BTreeMap<String, EnvSetting>,
    /// `EnvironmentFile=` files, in the order systemd reads them.
    pub files: Vec<EnvFileRef>,
}

/// The words of an `Environment=` value as systemd splits them (extract_first_word with
/// quotes removed and C escapes resolved, the common cases): `"A=b c" D=e` → `A=b c`,
/// `D=e`.
fn env_words(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quote, mut any, mut esc) = (None::<char>, false, false);
    for c in value.chars() {
        if esc {
            cur.push(c);
            esc = false;
            continue;
        }
        match (quote, c) {
            (_, '\\') => esc = true,
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (_, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The environment settings of `files` (name, text) given in systemd's order.
pub fn service_env<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> ServiceEnv {
    let mut env = ServiceEnv::default();
    for (name, text) in files {
        let mut in_service = false;
        for (line, l) in numbered_lines(text) {
            let t = l.trim();
            if t.starts_with('[') {
                in_service = t == "[Service]";
                continue;
            }
            let Some((key, value)) = t.split_once('=').filter(|_| in_service) else {
                continue;
            };
            let value = value.trim();
            match key.trim() {
                "Environment" if value.is_empty() => env.vars.clear(),
                "Environment" => {
                    for w in env_words(value) {
                        if let Some((k, v)) = w.split_once('=') {
                            let set = EnvSetting {
                                file: name.to_string(),
                                line,
                                value: v.to_string(),
                            };
                            env.vars.insert(k.to_string(), set);
                        }
                    }
                }
                "EnvironmentFile" if value.is_empty() => env.files.clear(),
                "EnvironmentFile" => {
                    for w in env_words(value) {
                        let (optional, path) = match w.strip_prefix('-') {
                            Some(p) => (true, p.to_string()),
                            None => (false, w),
                        };
                        env.files.push(EnvFileRef { path, optional });
                    }
                }
                _ => {}
            }
        }
    }
    env
}

/// The last assignment of `var` in an environment file `text` (systemd's env-file
/// parser): its 1-based line and value; None when the file does not assign it.
pub fn env_file_value(text: &str, var: &str) -> Option<(usize, String)> {
    let list = crate::envfile::scan(text);
    let a = list.iter().rev().find(|a| a.key == var)?;
    let line = text[..a.key_start.min(text.len())].matches('\n').count() + 1;
    Some((line, a.value.text().to_string()))
}

/// Every assignment of an environment file `text` (systemd's env-file parser), in the
/// file's order: (variable, 1-based line, value). The last one of a variable is
/// [`env_file_value`]'s answer; one scan for all the variables looked up in a file.
pub fn env_file_values(text: &str) -> Vec<(String, usize, String)> {
    crate::envfile::scan(text)
        .iter()
        .map(|a| {
            let line = text[..a.key_start.min(text.len())].matches('\n').count() + 1;
            (a.key.to_string(), line, a.value.text().to_string())
        })
        .collect()
}

/// The variables an `ExecStart=` word expands (`$VAR` as a whole word, split on
/// whitespace; `${VAR}` anywhere in it), per systemd.service(5) "Command lines".
pub fn var_refs(word: &str) -> Vec<String> {
    let name = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut rest = word;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        if let Some(b) = rest.strip_prefix('{') {
            if let Some(end) = b.find('}') {
                out.push(b[..end].to_string());
                rest = &b[end + 1..];
            }
        } else if i == 0 && out.is_empty() && word.starts_with('$') {
            let n = name(rest);
            if !n.is_empty() && n.len() == rest.len() {
                out.push(n);
            }
            break;
        }
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

    #[test]
    fn environment_settings_follow_systemd_exec() {
        let kubeadm = "[Service]\nEnvironment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"\nEnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\nEnvironmentFile=-/etc/default/kubelet\n";
        let local = "[Service]\n# c\nEnvironment=\"KUBELET_EXTRA_ARGS=--max-pods=300 --v=2\" OTHER=x\nEnvironmentFile=/etc/kubelet.env\n[Install]\nEnvironment=IGNORED=1\n";
        let env = service_env([("10-kubeadm.conf", kubeadm), ("20-local.conf", local)]);
        assert_eq!(
            env.vars["KUBELET_EXTRA_ARGS"],
            EnvSetting {
                file: "20-local.conf".into(),
                line: 3,
                value: "--max-pods=300 --v=2".into()
            }
        );
        assert_eq!(env.vars["OTHER"].value, "x");
        assert!(!env.vars.contains_key("IGNORED"));
        let paths: Vec<(&str, bool)> = env
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.optional))
            .collect();
        assert_eq!(
            paths,
            [
                ("/var/lib/kubelet/kubeadm-flags.env", true),
                ("/etc/default/kubelet", true),
                ("/etc/kubelet.env", false)
            ]
        );
        // empty settings reset the lists
        let reset = service_env([
            ("a", kubeadm),
            ("b", "[Service]\nEnvironment=\nEnvironmentFile=\n"),
        ]);
        assert_eq!(reset, ServiceEnv::default());
        assert_eq!(
            env_file_value(
                "# x\nA=1\nKUBELET_EXTRA_ARGS=\"--a=1\"\n",
                "KUBELET_EXTRA_ARGS"
            ),
            Some((3, "--a=1".into()))
        );
        assert_eq!(var_refs("$KUBELET_EXTRA_ARGS"), ["KUBELET_EXTRA_ARGS"]);
        assert_eq!(var_refs("--config=${CFG}"), ["CFG"]);
        assert!(var_refs("--x=a$b").is_empty());
    }

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

    /// Every assignment of a file, in order, with its line: the last one of a variable
    /// is what [`env_file_value`] answers, for every variable of the file.
    #[test]
    fn env_file_values_agree_with_env_file_value() {
        let text = "# c\nA=1\nexport B=\"two words\"\nA='3'\n\nC=x\\\ny\nD=4";
        let all = env_file_values(text);
        assert_eq!(all.len(), 5, "{all:?}");
        for var in ["A", "B", "C", "D", "E"] {
            let last = all
                .iter()
                .rev()
                .find(|(k, _, _)| k == var)
                .map(|(_, l, v)| (*l, v.clone()));
            assert_eq!(last, env_file_value(text, var), "{var}");
        }
        assert_eq!(env_file_value(text, "A"), Some((4, "3".to_string())));
    }
}
