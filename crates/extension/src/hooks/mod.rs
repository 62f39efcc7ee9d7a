//! The Runtime SDK hooks the extension serves, one file each, and the one table that
//! names them: [`Hook`] (the path, the response kind, the answer when the deadline
//! passes, the metrics label). Adding a hook: a row in [`Hook::row`], its handler file,
//! its arm in [`crate::http::route`], its entry in [`crate::capi::types::HANDLERS`].
//!
//! - [`can_update_machine`]: asks the Machine's node about the desired NodeSpec.
//! - [`can_update_machine_set`]: the declared capabilities, no node asked.
//! - [`update_machine`]: the operation id and the request checks; [`driver`] drives the
//!   agent's operation of the update to its end.

pub(crate) mod can_update_machine;
pub(crate) mod can_update_machine_set;
pub(crate) mod driver;
pub(crate) mod update_machine;
pub(crate) mod verify;

use serde_json::Value;

use crate::capi::Verdict;
use crate::capi::types::{API_VERSION, Status, UpdateMachineResponse, failure};
use inplace_wire::pb;

/// A hook of `hooks.runtime.cluster.x-k8s.io/v1alpha1` this extension serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    /// `discovery`: the handlers and their timeouts.
    Discovery,
    /// `canupdatemachine/can-update-machine`.
    CanUpdateMachine,
    /// `canupdatemachineset/can-update-machineset`.
    CanUpdateMachineSet,
    /// `updatemachine/update-machine`.
    UpdateMachine,
}

/// What a hook answers when its deadline passes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnTimeout {
    /// `Failure` with the reason: CAPI retries the call (the CanUpdate hooks, whose
    /// `Success` would be read as an answer about coverage).
    Failure,
    /// `Success` with `update.retry_after_seconds`: the operation, if it started, goes on
    /// on the node, and the next call finds it.
    Retry,
}

/// One row of the hook table.
#[derive(Debug, Clone, Copy)]
struct Row {
    /// Path under `/<API_VERSION>/`: `<hook lowercased>/<handler name>`.
    path: &'static str,
    /// `kind` of the response.
    kind: &'static str,
    /// `hook` label of the metrics (the hook's name).
    label: &'static str,
    on_timeout: OnTimeout,
}

impl Hook {
    /// Every hook: discovery, then the handlers in the order discovery registers them.
    pub(crate) const ALL: [Hook; 4] = [
        Hook::Discovery,
        Hook::CanUpdateMachine,
        Hook::CanUpdateMachineSet,
        Hook::UpdateMachine,
    ];

    /// The table: everything that names a hook.
    fn row(self) -> Row {
        match self {
            Hook::Discovery => Row {
                path: "discovery",
                kind: "DiscoveryResponse",
                label: "Discovery",
                on_timeout: OnTimeout::Failure,
            },
            Hook::CanUpdateMachine => Row {
                path: "canupdatemachine/can-update-machine",
                kind: "CanUpdateMachineResponse",
                label: "CanUpdateMachine",
                on_timeout: OnTimeout::Failure,
            },
            Hook::CanUpdateMachineSet => Row {
                path: "canupdatemachineset/can-update-machineset",
                kind: "CanUpdateMachineSetResponse",
                label: "CanUpdateMachineSet",
                on_timeout: OnTimeout::Failure,
            },
            Hook::UpdateMachine => Row {
                path: "updatemachine/update-machine",
                kind: "UpdateMachineResponse",
                label: "UpdateMachine",
                on_timeout: OnTimeout::Retry,
            },
        }
    }

    /// The hook a request path names: `/<API_VERSION>/<path>` exactly.
    pub(crate) fn of_path(path: &str) -> Option<Hook> {
        let rest = path.strip_prefix('/')?.strip_prefix(API_VERSION)?;
        let rest = rest.strip_prefix('/')?;
        Hook::ALL.into_iter().find(|h| h.row().path == rest)
    }

    /// `kind` of the hook's response (`CanUpdateMachineResponse`, ...).
    pub(crate) fn response_kind(self) -> &'static str {
        self.row().kind
    }

    /// The hook's name, the `hook` label of the metrics.
    pub(crate) fn label(self) -> &'static str {
        self.row().label
    }

    /// The answer CAPI can act on when the hook did not answer within its deadline
    /// (`why`): see [`OnTimeout`]; `retry_after_seconds` is `update.retry_after_seconds`.
    pub(crate) fn timeout_answer(self, why: &str, retry_after_seconds: i32) -> (Value, Answer) {
        match self.row().on_timeout {
            OnTimeout::Retry => {
                let r = UpdateMachineResponse::new(
                    Status::Success,
                    format!("waiting: {why}"),
                    retry_after_seconds,
                );
                let answer = Answer::of_update(&r);
                (serde_json::to_value(r).unwrap_or_default(), answer)
            }
            OnTimeout::Failure => (
                failure(self.response_kind(), &format!("{why}; CAPI will retry")),
                Answer::Failure,
            ),
        }
    }
}

/// What a hook answered, decided where the answer is made: the `answer` label of
/// `inplace_extension_hook_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A CanUpdate hook: only covered differences (patches).
    Covered,
    /// A CanUpdate hook: some difference not covered.
    NotCovered,
    /// A CanUpdate hook: not covered, and CAPI is asked to keep the Machine.
    Preserve,
    /// No difference, or a hook that answers no question (discovery).
    Nothing,
    /// UpdateMachine: not done yet (`retryAfterSeconds` > 0).
    InProgress,
    /// UpdateMachine: done.
    Done,
    /// `status: Failure`.
    Failure,
}

impl Answer {
    /// The metrics label (`covered`, `not_covered`, ...).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Answer::Covered => "covered",
            Answer::NotCovered => "not_covered",
            Answer::Preserve => "preserve",
            Answer::Nothing => "nothing",
            Answer::InProgress => "in_progress",
            Answer::Done => "done",
            Answer::Failure => "failure",
        }
    }

    /// A CanUpdate hook's successful answer.
    pub(crate) fn of_verdict(v: Verdict) -> Answer {
        match v {
            Verdict::Covered => Answer::Covered,
            Verdict::NotCovered => Answer::NotCovered,
            Verdict::Preserve => Answer::Preserve,
            Verdict::NoChanges => Answer::Nothing,
        }
    }

    /// An UpdateMachine answer: failed, in progress (CAPI calls again) or done.
    pub(crate) fn of_update(r: &UpdateMachineResponse) -> Answer {
        if r.status == Status::Failure {
            Answer::Failure
        } else if r.retry_after_seconds > 0 {
            Answer::InProgress
        } else {
            Answer::Done
        }
    }
}

/// A CanUpdate hook's response as JSON, with its answer (a response that can not be
/// serialized is a `Failure` with the reason).
pub(crate) fn reply<T: serde::Serialize>(hook: Hook, resp: T, answer: Answer) -> (Value, Answer) {
    match serde_json::to_value(resp) {
        Ok(v) => (v, answer),
        Err(e) => (
            failure(hook.response_kind(), &e.to_string()),
            Answer::Failure,
        ),
    }
}

/// Whether the agent refused the spec itself (invalid, or over one of its limits:
/// `INVALID_ARGUMENT`, or `RESOURCE_EXHAUSTED` for the message size): a property of the
/// desired KubeadmConfig, so "not covered" with the node's reason, never a retry.
pub(crate) fn refuses_spec(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
    )
}

/// An `Inspect` that asks the node's status alone (no spec is sent).
pub(crate) fn status_only() -> pb::InspectRequest {
    pb::InspectRequest {
        status: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
