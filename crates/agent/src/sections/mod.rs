//! NodeSpec sections: one folder per section of the spec, each behind the
//! [`kit::Section`] trait, driven by the planner ([`crate::plan`]) in the fixed order of
//! [`SECTIONS`].
//!
//! A section
//! 1. owns its part of the spec model (`<x>/spec.rs`: its type, validation naming the
//!    field, its drop-in merge, its hash contribution, its conversion from the wire form);
//! 2. observes what it needs from the sysroot (`<x>/observe.rs`, [`kit::Section::observe`]:
//!    its only I/O; all that follows is a pure function of the observation);
//! 3. diffs desired × observed × applied record into changes (id, operation, covered and
//!    reason, disruption) and steps (writes, removals, unit actions, its effects): whole
//!    files through the shared file machinery ([`kit::Section::file_items`],
//!    [`kit::file_items`]), anything else in [`kit::Section::diff`] (`<x>/mod.rs`);
//! 4. implements its effects on the live node (`<x>/effects.rs`, each a
//!    [`kit::effect::Effect`]: the stage it runs at, apply, the undo of each completed
//!    change, its journal entry), which the engine runs without knowing what they do:
//!    `sysctls` (the live write and its read-back), `kubelet` (the manager checkpoints'
//!    reset in place of the kubelet's restart, the health gate), `kubernetes` (the version
//!    upgrade), `kernel_args` (the boot-configuration command, run again after a rollback);
//! 5. says what is verified only after the boot ([`kit::Section::verified_after_boot`],
//!    [`kit::Section::verify_after_boot`], [`kit::Section::verify_applied_after_boot`]);
//! 6. reports drift of its managed items ([`kit::Section::drift`], [`kit::Section::watched`]);
//! 7. keeps its unit tests beside it (`<x>/tests.rs`).
//!
//! Sections never import each other. What two of them share lives in [`kit`] (the
//! trait, the change builder, the steps, the effect trait and the node it acts on, the
//! observation primitives, the whole-file machinery) or in the domain crate it belongs to ([`inplace_formats::sysctl`],
//! [`inplace_formats::cmdline`], [`crate::bootloader`], [`inplace_formats::kubelet`]).
//! The aggregates the sections fill are in [`model`]: [`model::NodeSpec`] (one field per
//! section; the drivers that convert, merge and hash it call each section's `spec.rs` in
//! turn) and [`model::Observed`].
//!
//! Adding a section `x` takes:
//! - its folder `x/` (`mod.rs` with the [`kit::Section`] impl, `spec.rs`, `observe.rs` if
//!   it reads the node, `effects.rs` if it acts on the live node beyond whole files and
//!   unit actions, `tests.rs`), a `pub mod x;` here and one line in [`SECTIONS`];
//! - its fields in the aggregates of [`model`]: `NodeSpec` and a line in each of its
//!   drivers (`from_pb_items`; `Sources::merge`, with a field of `Sources` when the
//!   section refuses an item set by two sources; `hash`, whose new part is added only
//!   when the section is set, so older specs keep their hash), and `Observed` (with
//!   `Observed::empty`) when it observes something;
//! - a field of `NodeSpec` in `proto/inplace/v1/inplace.proto` and its key in the YAML
//!   form ([`inplace_wire::yaml`]); when the field is a message, an arm in
//!   `inplace_wire::limits`' `child()` so that its values are counted.
//!
//! A rule between two sections (a `files` item at a path `ntp` writes) is checked by the
//! driver after the merge ([`model::NodeSpec::from_pb`]), the sections' parts passed in:
//! sections never import each other.
//!
//! A section with effects beyond whole files and unit actions adds `x/effects.rs` and
//! pushes them with [`kit::steps::Steps::effect`]; the engine needs nothing new. Only an
//! effect undone after a crash reaches outside the folder: a variant of
//! [`crate::state::EffectEntry`] (a field of the journal's on-disk intent) and its line in
//! [`journaled_undo`]. Record fields are [`crate::state::AppliedRecord`]'s.

pub(crate) mod dropins;
pub(crate) mod files;
pub(crate) mod kernel_args;
pub(crate) mod kit;
pub(crate) mod kubelet;
pub(crate) mod kubernetes;
pub mod model;
pub(crate) mod ntp;
pub(crate) mod sysctls;

use crate::state::EffectEntry;
use kit::Section;
use kit::effect::UndoEntry;

/// The sections in the order the planner drives them. The order is the order of the
/// steps (the file items of `files`, `ntp`, `dropins` are written first, in this order),
/// never the order of the report, whose changes are sorted by id.
pub static SECTIONS: &[&dyn Section] = &[
    // first: the version upgrade runs before every other step, the other sections apply
    // to the upgraded node
    &kubernetes::Kubernetes,
    &files::Files,
    &ntp::Ntp,
    &dropins::Dropins,
    &kubelet::Kubelet,
    &kernel_args::KernelArgs,
    &sysctls::Sysctls,
];

/// How to undo, after a crash, an effect the journal kept ([`EffectEntry`]): the owning
/// section's undo, or a command run again once the paths are back.
pub fn journaled_undo(entry: &EffectEntry) -> UndoEntry {
    match entry {
        EffectEntry::Sysctl { key, prior } => {
            UndoEntry::Step(Box::new(sysctls::effects::RestoreSysctl {
                key: key.clone(),
                prior: prior.clone(),
            }))
        }
        EffectEntry::Rerun(argv) => UndoEntry::Rerun(argv.clone()),
    }
}

/// After a boot: what the running node lacks or still has of the whole applied `record`,
/// over every section ([`kit::Section::verify_applied_after_boot`]).
pub fn verify_applied_after_boot(
    record: &crate::state::AppliedRecord,
    boot: &kit::Boot<'_>,
    boot_id: &str,
) -> kit::AfterBoot {
    let mut all = kit::AfterBoot::default();
    for s in SECTIONS {
        let a = s.verify_applied_after_boot(record, boot, boot_id);
        all.missing.extend(a.missing);
        all.lingering.extend(a.lingering);
    }
    all
}
