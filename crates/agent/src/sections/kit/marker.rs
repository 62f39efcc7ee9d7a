//! The journal's progress markers (`journal/<op>/progress`): every marker the engine or
//! an effect writes is a [`Marker`], and the start-up recovery reads it back with
//! [`Marker::parse`], so no step can write a marker that recovery does not understand.
//! [`Marker::not_journaled`] says what a crash after the marker leaves that the
//! journal's pre-images can not put back (a Kubernetes upgrade's binaries, packages and
//! what `kubeadm upgrade node` rewrote), which makes that recovery incomplete.

/// How far an operation got, as its journal says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// The intent and pre-images are durable (`staged`).
    Staged,
    /// Every file is written, live values set (`written`).
    Written,
    /// Commands and unit actions ran (`acted`).
    Acted,
    /// A step of a Kubernetes upgrade began (`kubernetes: <step>`), or it completed
    /// (`kubernetes: upgraded`).
    Kubernetes(String),
}

impl Marker {
    /// One marker of each kind (the set recovery is tested against).
    pub fn examples() -> Vec<Marker> {
        vec![
            Marker::Staged,
            Marker::Written,
            Marker::Acted,
            Marker::Kubernetes("upgrading kubeadm to v1.31.2".into()),
            Marker::Kubernetes("kubeadm upgrade node".into()),
            Marker::Kubernetes("upgraded".into()),
        ]
    }

    /// The text written to the journal.
    pub fn text(&self) -> String {
        match self {
            Marker::Staged => "staged".into(),
            Marker::Written => "written".into(),
            Marker::Acted => "acted".into(),
            Marker::Kubernetes(step) => format!("kubernetes: {step}"),
        }
    }

    /// The marker `text` names; None for a text no version of the engine writes.
    pub fn parse(text: &str) -> Option<Marker> {
        match text {
            "staged" => Some(Marker::Staged),
            "written" => Some(Marker::Written),
            "acted" => Some(Marker::Acted),
            t => t
                .strip_prefix("kubernetes: ")
                .filter(|s| !s.is_empty())
                .map(|s| Marker::Kubernetes(s.to_string())),
        }
    }

    /// What a crash after this marker leaves that the journal can not put back, naming
    /// where the saved originals are (`backup_dir`: `[kubernetes] backup_dir`); None
    /// when the journal's pre-images and effect entries undo everything.
    pub fn not_journaled(&self, backup_dir: &str) -> Option<String> {
        match self {
            Marker::Staged | Marker::Written | Marker::Acted => None,
            Marker::Kubernetes(step) => Some(format!(
                "a Kubernetes upgrade had begun (last step: {step}): the binaries or packages it installed and what kubeadm upgrade node rewrote are not in the journal and were not put back; the previous binaries are kept in {backup_dir} as <binary>-<version>"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Marker;

    /// Every marker a step writes is read back as itself at start-up, and those that
    /// leave something the journal can not undo say so.
    #[test]
    fn every_marker_is_understood_at_start_up() {
        for m in Marker::examples() {
            assert_eq!(Marker::parse(&m.text()), Some(m.clone()), "{m:?}");
            let incomplete = m.not_journaled("/var/lib/inplaced/k8s-backup");
            assert_eq!(incomplete.is_some(), matches!(m, Marker::Kubernetes(_)));
        }
        assert_eq!(Marker::parse("kubernetes: "), None);
        assert_eq!(Marker::parse("restarting"), None);
    }
}
