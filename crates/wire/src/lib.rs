//! # inplace-wire
//!
//! The wire API of inplaced (`proto/inplace/v1/inplace.proto`, [`pb`]) and what both
//! programs, the node agent and the CAPI Runtime Extension, say about it the same way:
//! phases and their transitions ([`phase`]), change ids ([`ids`]), request limits counted on the raw bytes
//! ([`limits`]), safe names and field-naming errors ([`names`]), the NodeSpec YAML file
//! form ([`yaml`], [`structs`]) and Kubernetes versions with the skew policy
//! ([`k8s_version`]). Nothing here does I/O.

pub mod ids;
pub mod k8s_version;
pub mod limits;
pub mod names;
pub mod pb;
pub mod phase;
pub mod structs;
pub mod yaml;
