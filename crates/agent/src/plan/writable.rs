//! Coverage approves only what the apply can write (issue 27 §3): every path the plan
//! writes or removes is asked [`Sysroot::write_blocker`] (immutable or append-only
//! attribute on it or its directory, a read-only mount, too little space for the new
//! content), and the changes that target a blocked path are not covered, naming why.

use super::Plan;
use inplace_node::sysroot::Sysroot;

/// Marks not covered every change of `plan` that targets a path the node would refuse
/// to write or remove (a change that lists no target is refused with the first such
/// path: the apply would fail there); recomputes `fully_covered`. A path whose probe
/// itself fails is left to the apply (which names the error).
pub(crate) fn refuse_unwritable(plan: &mut Plan, root: &Sysroot) {
    let steps = &plan.steps;
    let targets = steps
        .writes
        .iter()
        .map(|w| (w.path.as_str(), w.content.len() as u64))
        .chain(steps.removes.iter().map(|r| (r.path.as_str(), 0)));
    let mut blocked = Vec::new();
    let mut linked = Vec::new();
    for (path, bytes) in targets {
        if let Ok(Some(why)) = root.write_blocker(path, bytes) {
            blocked.push((path.to_string(), why));
        }
        if let Ok(Some(n)) = root.hard_links(path)
            && n > 1
        {
            linked.push((path.to_string(), n));
        }
    }
    name_hard_links(plan, &linked);
    if blocked.is_empty() {
        return;
    }
    for c in &mut plan.report.changes {
        let hit = blocked
            .iter()
            .find(|(p, _)| c.targets.iter().any(|t| t == p))
            .or_else(|| c.targets.is_empty().then(|| &blocked[0]));
        if let Some((path, why)) = hit {
            c.covered = false;
            c.reason = format!("{path} can not be written: {why}");
        }
    }
    plan.report.fully_covered = plan.report.changes.iter().all(|c| c.covered);
}

/// Adds to the reason of each change that targets a file with more than one hard link
/// what the apply does to the other links (issue 27 §4): the file is replaced by a new
/// one, the other links keep the old content, and a revert does not link them again.
fn name_hard_links(plan: &mut Plan, linked: &[(String, u64)]) {
    for c in &mut plan.report.changes {
        if let Some((path, n)) = linked
            .iter()
            .find(|(p, _)| c.targets.iter().any(|t| t == p))
        {
            c.reason = format!(
                "{}; {path} has {n} hard links: the apply replaces it with a new file, so the other {} link(s) keep the old content, and a revert does not link them again",
                c.reason,
                n - 1
            );
        }
    }
}
