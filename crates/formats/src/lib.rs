//! # inplace-formats
//!
//! Faithful editors of the node file formats inplaced changes, free of I/O and of agent
//! types: each parses the bytes it is given, edits only what it owns and gives the bytes
//! back with everything else as it was. [`textedit`] (decoded values mapped back to their
//! raw bytes), [`cmdline`] (the kernel command line), [`kubelet`] (KubeletConfiguration,
//! `kubeadm-flags.env`, the field catalogue, checkpoint rules; its `EnvironmentFile=`
//! lexer is `envfile`), [`grub_default`] and
//! [`grubenv`] (GRUB), [`bls`] (Boot Loader Specification Type #1 entries), [`sysctl`]
//! (sysctl.d) and [`ntp`] (chrony and systemd-timesyncd).

pub mod bls;
pub mod cmdline;
mod envfile;
pub mod grub_default;
pub mod grubenv;
pub mod kubelet;
pub mod ntp;
pub mod sysctl;
pub mod textedit;
