//! Generated wire types of `proto/inplace/v1/inplace.proto` (package `inplace.v1`), with
//! proto3 JSON mapping (camelCase) through pbjson.
#![allow(missing_docs, clippy::all, missing_debug_implementations)]

tonic::include_proto!("inplace.v1");
include!(concat!(env!("OUT_DIR"), "/inplace.v1.serde.rs"));

/// Encoded `FileDescriptorSet` of the inplace API, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("inplace_descriptor");
