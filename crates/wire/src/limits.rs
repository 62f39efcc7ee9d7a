//! Request limits checked on the raw protobuf bytes, before any of the request is built.
//!
//! A 39 MiB message of two million tiny files costs about 1.5 GB and seconds of CPU once
//! prost has decoded it and the spec model has converted it; counting afterwards is too
//! late. So the generated service uses [`LimitedCodec`] (`codec_path` in `build.rs`): for a
//! `GetCoverageRequest`, `ApplyRequest` or `InspectRequest` it walks the wire format of the `desired`
//! NodeSpec first (tags and lengths only, no allocation) and refuses with
//! `INVALID_ARGUMENT`, naming the list and the `policy.` key, when
//!
//! - `files` has more entries than `policy.max_files`, or
//! - the NodeSpec holds more fields in all than `policy.max_spec_elements` (every list
//!   entry, map entry and KubeletConfiguration value counts: a `google.protobuf.Struct` of
//!   millions of empty values is as costly as millions of files).
//!
//! Protobuf merges repeated occurrences of a message field, so every occurrence of
//! `desired` is counted. The walk knows the NodeSpec schema (`proto/inplace/v1/inplace.proto`
//! and `google/protobuf/struct.proto`) and does not descend into strings or bytes.
//!
//! The message size is tonic's `max_decoding_message_size` (`policy.max_spec_bytes` plus
//! 1 MiB); tonic reports an over-size message as `OUT_OF_RANGE`, which
//! [`resource_exhausted_for_size`] turns into `RESOURCE_EXHAUSTED`, the code gRPC's
//! `doc/statuscodes.md` gives for a message larger than the configured limit (no call of
//! this API answers `OUT_OF_RANGE` otherwise).

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::OnceLock;

use bytes::Buf as _;
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::pb;

/// The limits [`LimitedCodec`] enforces, from `[policy]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLimits {
    /// `policy.max_files`.
    pub max_files: usize,
    /// `policy.max_spec_elements`.
    pub max_elements: usize,
}

static LIMITS: OnceLock<WireLimits> = OnceLock::new();

/// Sets the limits of this process (the first call wins; the daemon calls it once before
/// serving). Without a call nothing is checked (clients decode with the same codec).
pub fn install(l: WireLimits) {
    let _ = LIMITS.set(l);
}

/// What the walk counted in a request's NodeSpec.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Entries of `files`.
    pub files: usize,
    /// Every field occurrence below the NodeSpec.
    pub elements: usize,
    /// The deepest nesting of maps and lists in `kubelet.config` (a map of scalars is 1).
    pub config_depth: usize,
}

/// Deepest nesting of maps and lists a `kubelet.config` may have. prost refuses a message
/// nested more than 100 messages deep (its recursion limit), which a map in `config` costs
/// three of (`Struct`, its entry, `Value`): 32 levels came back as an `INTERNAL` decoding
/// error that never named the field. A KubeletConfiguration nests three levels at most.
pub const MAX_CONFIG_DEPTH: usize = 24;

/// Why a `kubelet.config` nested `depth` maps and lists deep is refused, with the fix; None
/// within [`MAX_CONFIG_DEPTH`]. The wire check and the spec's validation (`inplacectl
/// validate`) both word it so, each with its own field name in front.
pub fn config_too_deep(depth: usize) -> Option<String> {
    (depth > MAX_CONFIG_DEPTH).then(|| {
        format!(
            "maps and lists nested {depth} levels deep, over the limit of {MAX_CONFIG_DEPTH}; a KubeletConfiguration nests a few levels, so give its fields as the kubelet documents them"
        )
    })
}

/// Message types of the NodeSpec schema the walk descends into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    NodeSpec,
    Kubelet,
    Struct,
    StructEntry,
    Value,
    ListValue,
    /// A message whose own fields are all strings or scalars (`Ntp`, `Kubernetes`).
    Leaves,
}

/// The message type of field `n` of a `kind`, if it is one the walk descends into.
fn child(kind: Kind, n: u64) -> Option<Kind> {
    match (kind, n) {
        (Kind::Request, 1) => Some(Kind::NodeSpec),
        (Kind::NodeSpec, 2) => Some(Kind::Kubelet),
        // ntp.servers and kubernetes.version: every field below counts
        (Kind::NodeSpec, 5 | 7) => Some(Kind::Leaves),
        (Kind::Kubelet, 1) => Some(Kind::Struct),
        (Kind::Struct, 1) => Some(Kind::StructEntry),
        (Kind::StructEntry, 2) => Some(Kind::Value),
        (Kind::Value, 5) => Some(Kind::Struct),
        (Kind::Value, 6) => Some(Kind::ListValue),
        (Kind::ListValue, 1) => Some(Kind::Value),
        _ => None,
    }
}

/// prost's recursion limit; deeper messages fail to decode anyway.
const MAX_DEPTH: usize = 100;

fn varint(b: &mut &[u8]) -> Option<u64> {
    prost::encoding::decode_varint(b).ok()
}

/// Counts the files and elements of the NodeSpec in a request's wire bytes. Malformed
/// bytes end the walk: prost then reports them.
pub fn count(buf: &[u8]) -> Counts {
    let mut c = Counts::default();
    walk(buf, Kind::Request, 0, 0, &mut c);
    c
}

/// Walks the message `b` of type `kind`, `depth` messages below the request and `levels`
/// maps and lists deep in `kubelet.config`.
fn walk(mut b: &[u8], kind: Kind, depth: usize, levels: usize, c: &mut Counts) {
    c.config_depth = c.config_depth.max(levels);
    if depth > MAX_DEPTH {
        return;
    }
    while !b.is_empty() {
        let Some(key) = varint(&mut b) else { return };
        let (n, wire) = (key >> 3, key & 7);
        if kind != Kind::Request {
            c.elements += 1;
            if kind == Kind::NodeSpec && n == 1 {
                c.files += 1;
            }
        }
        match wire {
            0 => {
                if varint(&mut b).is_none() {
                    return;
                }
            }
            1 => b = b.get(8..).unwrap_or_default(),
            5 => b = b.get(4..).unwrap_or_default(),
            2 => {
                let Some(len) = varint(&mut b) else { return };
                let Some(body) = usize::try_from(len).ok().and_then(|l| b.get(..l)) else {
                    return;
                };
                b = &b[body.len()..];
                if let Some(k) = child(kind, n) {
                    let levels = levels + usize::from(matches!(k, Kind::Struct | Kind::ListValue));
                    walk(body, k, depth + 1, levels, c);
                }
            }
            _ => return,
        }
    }
}

/// Checks the counts against the limits; the error names the field, the limit and the
/// `policy.` key.
pub fn check(c: Counts, l: WireLimits) -> Result<(), Status> {
    if c.files > l.max_files {
        return Err(Status::invalid_argument(format!(
            "desired.files: {} files, over the limit of {} (policy.max_files); split the spec or raise the limit",
            c.files, l.max_files
        )));
    }
    if let Some(why) = config_too_deep(c.config_depth) {
        return Err(Status::invalid_argument(format!(
            "desired.kubelet.config: {why}"
        )));
    }
    if c.elements > l.max_elements {
        return Err(Status::invalid_argument(format!(
            "desired: {} fields in all, over the limit of {} (policy.max_spec_elements); split the spec or raise the limit",
            c.elements, l.max_elements
        )));
    }
    Ok(())
}

/// prost's codec with the NodeSpec limits checked on the raw bytes of the two requests
/// that carry one (see the module doc).
#[derive(Debug, Clone)]
pub struct LimitedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LimitedCodec<T, U> {
    fn default() -> Self {
        LimitedCodec(PhantomData)
    }
}

impl<T, U> Codec for LimitedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LimitedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        LimitedDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// The decoder of [`LimitedCodec`].
#[derive(Debug)]
pub struct LimitedDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + 'static> Decoder for LimitedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // Each carries its NodeSpec as field 1 (`desired`).
        let carries_spec = TypeId::of::<U>() == TypeId::of::<pb::GetCoverageRequest>()
            || TypeId::of::<U>() == TypeId::of::<pb::ApplyRequest>()
            || TypeId::of::<U>() == TypeId::of::<pb::InspectRequest>();
        if carries_spec && let Some(l) = LIMITS.get() {
            // A DecodeBuf is one message in one contiguous buffer.
            check(count(buf.chunk()), *l)?;
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}

/// Rewrites tonic's `OUT_OF_RANGE` for an over-size message into `RESOURCE_EXHAUSTED`
/// (a trailers-only response carries the status in its headers). Used as a
/// `tower::util::MapResponseLayer` on the gRPC servers.
pub fn resource_exhausted_for_size<B>(
    mut r: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let h = r.headers_mut();
    if h.get("grpc-status").is_some_and(|v| v == "11") {
        h.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("8"),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_bytes(spec: pb::NodeSpec) -> Vec<u8> {
        pb::GetCoverageRequest {
            diff: None,
            desired: Some(spec),
            reboot_policy: 0,
        }
        .encode_to_vec()
    }

    #[test]
    fn counts_files_and_every_nested_value() {
        let files = (0..5)
            .map(|i| pb::File {
                path: format!("/etc/{i}"),
                content: b"\x0a\x02hi".to_vec(), // looks like a field: not descended into
                ..Default::default()
            })
            .collect();
        let list = pbjson_types::Value {
            kind: Some(pbjson_types::value::Kind::ListValue(
                pbjson_types::ListValue {
                    values: vec![pbjson_types::Value::default(); 3],
                },
            )),
        };
        let config = pbjson_types::Struct {
            fields: [("a".to_string(), list)].into(),
        };
        let spec = pb::NodeSpec {
            files,
            kubelet: Some(pb::Kubelet {
                config: Some(config),
                flags: [("max-pods".to_string(), "250".to_string())].into(),
            }),
            kernel_args: vec!["a=1".into(), "b".into()],
            ..Default::default()
        };
        let c = count(&spec_bytes(spec.clone()));
        assert_eq!(c.files, 5);
        // Inspect carries the spec at the same field, next to its flags
        let inspect = pb::InspectRequest {
            desired: Some(spec),
            reboot_policy: 1,
            status: true,
            operations: true,
            skip_coverage_when_busy: true,
        };
        assert_eq!(count(&inspect.encode_to_vec()), c);
        // 5 files (not descended into: max_files bounds them); kubelet, its config and
        // one flags entry; the struct entry, its key and value, the list and its 3
        // values; 2 kernel args
        assert_eq!(c.elements, 5 + 3 + 4 + 3 + 2, "{c:?}");
        // two occurrences of `desired` merge: both are counted
        let mut twice = spec_bytes(pb::NodeSpec {
            files: vec![pb::File::default()],
            ..Default::default()
        });
        twice.extend_from_within(..);
        assert_eq!(count(&twice).files, 2);
    }

    #[test]
    fn limits_name_the_key() {
        let l = WireLimits {
            max_files: 2,
            max_elements: 10,
        };
        let e = check(
            Counts {
                files: 3,
                elements: 3,
                ..Counts::default()
            },
            l,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("policy.max_files"), "{}", e.message());
        let e = check(
            Counts {
                files: 1,
                elements: 11,
                ..Counts::default()
            },
            l,
        )
        .unwrap_err();
        assert!(
            e.message().contains("policy.max_spec_elements"),
            "{}",
            e.message()
        );
        check(
            Counts {
                files: 2,
                elements: 10,
                ..Counts::default()
            },
            l,
        )
        .unwrap();
    }

    /// `kubelet.config` of maps `levels` deep, with a list at the bottom when `list`.
    fn nested_config(levels: usize, list: bool) -> pb::NodeSpec {
        let mut v = if list {
            pbjson_types::Value {
                kind: Some(pbjson_types::value::Kind::ListValue(
                    pbjson_types::ListValue {
                        values: vec![pbjson_types::Value::default()],
                    },
                )),
            }
        } else {
            pbjson_types::Value::default()
        };
        for _ in 1..levels {
            v = pbjson_types::Value {
                kind: Some(pbjson_types::value::Kind::StructValue(
                    pbjson_types::Struct {
                        fields: [("k".to_string(), v)].into(),
                    },
                )),
            };
        }
        pb::NodeSpec {
            kubelet: Some(pb::Kubelet {
                config: Some(pbjson_types::Struct {
                    fields: [("k".to_string(), v)].into(),
                }),
                flags: Default::default(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn config_nesting_is_refused_before_the_decoder_would_fail() {
        assert_eq!(count(&spec_bytes(nested_config(1, false))).config_depth, 1);
        assert_eq!(count(&spec_bytes(nested_config(3, true))).config_depth, 4);
        let l = WireLimits {
            max_files: 1000,
            max_elements: 200_000,
        };
        // the deepest allowed still decodes
        let ok = spec_bytes(nested_config(MAX_CONFIG_DEPTH, false));
        check(count(&ok), l).unwrap();
        pb::GetCoverageRequest::decode(ok.as_slice()).unwrap();
        // one deeper is refused naming the field, with maps or a list at the bottom
        for list in [false, true] {
            let levels = MAX_CONFIG_DEPTH + 1 - usize::from(list);
            let e = check(count(&spec_bytes(nested_config(levels, list))), l).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(
                e.message().starts_with(&format!(
                    "desired.kubelet.config: maps and lists nested {} levels deep, over the limit of {MAX_CONFIG_DEPTH}",
                    MAX_CONFIG_DEPTH + 1
                )),
                "{}",
                e.message()
            );
        }
        // what prost refuses is refused here first
        let deep = spec_bytes(nested_config(40, false));
        assert!(pb::GetCoverageRequest::decode(deep.as_slice()).is_err());
        assert!(check(count(&deep), l).is_err());
    }

    #[test]
    fn ntp_servers_count() {
        let spec = pb::NodeSpec {
            ntp: Some(pb::Ntp {
                servers: vec![String::new(); 1000],
            }),
            ..Default::default()
        };
        assert_eq!(count(&spec_bytes(spec)).elements, 1 + 1000);
    }

    #[test]
    fn malformed_bytes_end_the_walk() {
        assert_eq!(count(&[0x0a, 0xff]), Counts::default());
        assert_eq!(count(&[0x0a, 0x05, 0x0a]), Counts::default());
    }
}
