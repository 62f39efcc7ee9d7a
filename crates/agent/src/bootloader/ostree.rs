//! The `rpm-ostree` backend: arguments read from the booted deployment's BLS entries and
//! changed with `rpm-ostree kargs`.

use super::{Bls, FileEdit, KernelArgsBackend, NoBackend, Source, SourceFormat};
use inplace_formats::cmdline::Arg;
use inplace_node::sysroot::Sysroot;

/// rpm-ostree / bootc hosts (`/run/ostree-booted`): the next boot's arguments are read
/// from the deployment's BLS entries (`/boot/loader` is a symlink to `loader.0` or
/// `loader.1`), and changed with `rpm-ostree kargs --append-if-missing=ARG
/// --delete-if-present=ARG`, which stages a new deployment; ostree's own entries are never
/// edited by hand.
#[derive(Debug)]
pub(crate) struct Ostree {
    entries_dir: String,
    sources: Vec<Source>,
}

impl KernelArgsBackend for Ostree {
    fn name(&self) -> &'static str {
        "rpm-ostree"
    }
    fn reason(&self) -> String {
        format!(
            "rpm-ostree: /run/ostree-booted exists; arguments read from {} and changed with rpm-ostree kargs",
            self.entries_dir
        )
    }
    fn sources(&self) -> &[Source] {
        &self.sources
    }
    fn problem(&self) -> Option<String> {
        None
    }
    fn regenerate(&self) -> Option<Vec<String>> {
        None
    }
    fn boot_entries(&self) -> String {
        "boots with the change: the new deployment rpm-ostree kargs stages (earlier deployments keep their arguments for rollback)".to_string()
    }
    fn command_edit(&self, remove: &[Arg], append: &[Arg]) -> Option<Vec<String>> {
        let mut cmd = vec!["rpm-ostree".to_string(), "kargs".to_string()];
        cmd.extend(
            remove
                .iter()
                .map(|a| format!("--delete-if-present={}", a.as_str())),
        );
        cmd.extend(
            append
                .iter()
                .map(|a| format!("--append-if-missing={}", a.as_str())),
        );
        Some(cmd)
    }
    fn edit(&self, _remove: &[Arg], _append: &[Arg]) -> Result<Vec<FileEdit>, String> {
        Ok(Vec::new())
    }
    /// No trial: rpm-ostree has no one-shot boot of a deployment (`rpm-ostree kargs`
    /// stages the new default deployment; the previous one stays bootable from the menu
    /// and as `rpm-ostree rollback`'s target; greenboot, when installed, does the rest).
    fn trial(
        &self,
        _remove: &[Arg],
        _append: &[Arg],
        _meta: super::TrialMeta,
    ) -> Result<super::TrialPlan, String> {
        Err("rpm-ostree has no one-shot boot of a deployment: rpm-ostree kargs stages the change as the new default deployment, the previous deployment stays bootable as rpm-ostree rollback's target (greenboot, when installed, falls back on its own)".into())
    }
}

impl Ostree {
    /// The backend of an rpm-ostree host (`/run/ostree-booted`); None on any other host.
    /// A host without deployment entries is [`NoBackend`].
    pub(super) fn probe(root: &Sysroot) -> Result<Option<Ostree>, NoBackend> {
        let booted = root
            .stat("/run/ostree-booted")
            .map_err(|e| NoBackend(e.to_string()))?
            .is_some();
        if !booted {
            return Ok(None);
        }
        let dir = match root
            .read_link("/boot/loader")
            .map_err(|e| NoBackend(e.to_string()))?
        {
            Some(t) if !t.contains('/') && t.starts_with("loader") => format!("/boot/{t}/entries"),
            _ => "/boot/loader/entries".to_string(),
        };
        let Some(bls) = Bls::probe(root, &dir)? else {
            return Err(NoBackend(format!(
                "/run/ostree-booted exists but {dir} has no deployment entries"
            )));
        };
        // only the deployment entries, newest first; rpm-ostree owns every file
        let sources = bls
            .sources
            .into_iter()
            .filter(|s| matches!(s.format, SourceFormat::BlsEntry(_)))
            .take(1)
            .collect();
        Ok(Some(Ostree {
            entries_dir: dir,
            sources,
        }))
    }
}
