//! Kept coverage answers (issue 28) in black-box tests: a node whose daemon counts its
//! answers on a metrics listener, and a copy of a node for a daemon that keeps nothing
//! (`INPLACED_KEEP_COVERAGE=0`), whose answer is what a computation says.

use std::path::Path;
use std::time::Duration;

use super::Node;
use super::pki::free_port;
use super::scrape::{sample, scrape};

/// Past the racy margin (50 ms), so that a computed answer is kept.
pub(crate) fn settle() {
    std::thread::sleep(Duration::from_millis(150));
}

/// `inplaced_coverage_answers_total{answer}` on the daemon's metrics listener at `addr`:
/// (kept, computed).
pub(crate) fn answers(addr: &str) -> (f64, f64) {
    let (_, body) = scrape(addr);
    let n = |a: &str| {
        sample(
            &body,
            &format!("inplaced_coverage_answers_total{{answer=\"{a}\"}}"),
        )
        .unwrap_or(0.0)
    };
    (n("kept"), n("computed"))
}

/// A node of `fixture` with the metrics listener on loopback, prepared by `prepare`
/// before the daemon starts, started and settled; returns it with the listener's address.
pub(crate) fn counted(fixture: &str, prepare: impl FnOnce(&mut Node)) -> (Node, String) {
    let mut node = Node::new(fixture);
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(&node.config, format!("[metrics]\nlisten = \"{addr}\"\n")).unwrap();
    // why an answer was not kept, in the test's output when a scenario's guard fails
    node.env.push((
        "INPLACED_LOG".into(),
        "warn,inplaced::apply::kept=debug".into(),
    ));
    prepare(&mut node);
    node.start();
    settle();
    (node, addr)
}

/// Puts a file's (or a symlink's target's) mtime an hour back: a program modified in the
/// last 2 s has its version asked every time.
pub(crate) fn age(p: &Path) {
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::open(p)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
}

/// `cp -a from to`.
pub(crate) fn cp_a(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A node (not started) for a daemon that keeps nothing, on a copy of `node`'s root, state
/// (without the running daemon's lock) and config (without the metrics listener), with
/// the same environment: its answer is the computed one for `node` as it is now.
pub(crate) fn uncached_copy(node: &Node) -> Node {
    let mut f = Node::new("ubuntu-2404-grub");
    std::fs::remove_dir_all(&f.root).unwrap();
    cp_a(&node.root, &f.root);
    if node.state.exists() {
        cp_a(&node.state, &f.state);
        let _ = std::fs::remove_file(f.state.join("lock"));
    }
    let config: String = std::fs::read_to_string(&node.config)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("[metrics]") && !l.starts_with("listen ="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&f.config, config).unwrap();
    f.env = node.env.clone();
    f.env.push(("INPLACED_KEEP_COVERAGE".into(), "0".into()));
    f
}
