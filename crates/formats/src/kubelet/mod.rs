//! Kubelet configuration: the KubeletConfiguration file and kubeadm's flags env file.
pub mod checkpoints;
pub mod config;
pub mod fields;
pub mod flags;
pub mod unit;
