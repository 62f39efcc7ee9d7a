//! Routing and deadlines of one request: which [`Hook`] its path names, the hook's
//! deadline ([`Extension::deadline`]), the answer CAPI can act on when the deadline
//! passes first, and the hook metrics (`hook_calls_total{hook,answer}`, from the typed
//! [`Answer`] the hook gave, and `hook_duration_seconds`).

use std::time::Duration;

use hyper::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::agent::HOOK;
use crate::capi::types::{
    API_VERSION, CanUpdateMachineRequest, CanUpdateMachineSetRequest, UpdateMachineRequest,
    discovery, failure,
};
use crate::config;
use crate::extension::Extension;
use crate::hooks::{Answer, Hook};
use crate::metrics;
use crate::waiting::{NODE_AGENT, WAITING, missed};

/// Time kept back from a hook's deadline for the answer to reach CAPI (at most a quarter
/// of the deadline).
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_millis(1500);

/// One answered request: the HTTP status, the JSON body, and what the hook answered.
struct Reply {
    status: StatusCode,
    body: Value,
    answer: Answer,
}

impl Reply {
    /// A `200 OK` answer of a hook.
    fn ok((body, answer): (Value, Answer)) -> Reply {
        Reply {
            status: StatusCode::OK,
            body,
            answer,
        }
    }

    /// A request no hook answered (refused before it was read, or not a hook's).
    fn refused(status: StatusCode, body: Value) -> Reply {
        Reply {
            status,
            body,
            answer: Answer::Failure,
        }
    }
}

impl Extension {
    /// The deadline of one hook call: CAPI's `?timeout=` query parameter (a Go duration,
    /// which upstream's runtime client adds from the handler's `timeoutSeconds`) when
    /// present, else `server.handler_timeout_seconds`, less [`DEADLINE_MARGIN`] for the
    /// answer to travel back.
    pub(crate) fn deadline(&self, query: Option<&str>) -> Duration {
        let advertised =
            Duration::from_secs(self.config.server.handler_timeout_seconds.max(1) as u64);
        let asked = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|kv| kv.strip_prefix("timeout="))
            .and_then(|v| config::parse_duration(v).ok())
            .filter(|d| !d.is_zero());
        let budget = asked.map_or(advertised, |a| a.min(advertised));
        budget.saturating_sub(DEADLINE_MARGIN.min(budget / 4))
    }

    /// Routes one request: (HTTP status, JSON body). A hook that has not answered by
    /// `deadline` gets the answer CAPI can act on (`Hook::timeout_answer`):
    /// UpdateMachine `Success` with `retryAfterSeconds` (the operation, if it started, goes
    /// on on the node, and the next call finds it), a CanUpdate hook `Failure` with the
    /// reason (CAPI retries). `values` is [`crate::budget::check`] of `body`, made once by
    /// the caller (which reserves memory by it) and not walked again here. Requests that
    /// name no hook (`GET /healthz`, unknown paths) are answered at once and not counted.
    pub(crate) async fn handle(
        &self,
        method: &str,
        path: &str,
        deadline: Duration,
        body: &[u8],
        values: &Result<usize, String>,
    ) -> (StatusCode, Value) {
        let Some(hook) = Hook::of_path(path) else {
            let r = not_a_hook(method, path);
            return (r.status, r.body);
        };
        let t = std::time::Instant::now();
        let r = HOOK
            .scope(
                hook.label(),
                self.answer_in_time(hook, method, path, deadline, body, values),
            )
            .await;
        if r.status == StatusCode::OK {
            metrics::get().hook(hook.label(), r.answer.label(), t.elapsed().as_secs_f64());
        }
        (r.status, r.body)
    }

    async fn answer_in_time(
        &self,
        hook: Hook,
        method: &str,
        path: &str,
        deadline: Duration,
        body: &[u8],
        values: &Result<usize, String>,
    ) -> Reply {
        let route = self.route(hook, method, body, values);
        let (r, what) = WAITING
            .scope(std::cell::Cell::new(NODE_AGENT), async {
                let r = tokio::time::timeout(deadline, route).await;
                (r, WAITING.with(|w| w.get()))
            })
            .await;
        match r {
            Ok(r) => r,
            Err(_) => {
                metrics::get().deadline_missed(hook.label());
                let why = missed(what, deadline);
                tracing::warn!(path, "{why}");
                Reply::ok(hook.timeout_answer(&why, self.config.update.retry_after_seconds))
            }
        }
    }

    /// Parses the request of `hook` and answers it.
    async fn route(
        &self,
        hook: Hook,
        method: &str,
        body: &[u8],
        values: &Result<usize, String>,
    ) -> Reply {
        if method != "POST" {
            return Reply::refused(
                StatusCode::METHOD_NOT_ALLOWED,
                serde_json::json!({"message": "use POST"}),
            );
        }
        match hook {
            Hook::Discovery => {
                let v = serde_json::to_value(discovery(self.config.server.handler_timeout_seconds))
                    .unwrap_or_default();
                Reply::ok((v, Answer::Nothing))
            }
            Hook::CanUpdateMachine => match parse::<CanUpdateMachineRequest>(hook, body, values) {
                Ok(req) => Reply::ok(self.can_update_machine(req).await),
                Err(r) => r,
            },
            Hook::CanUpdateMachineSet => {
                match parse::<CanUpdateMachineSetRequest>(hook, body, values) {
                    Ok(req) => Reply::ok(self.can_update_machine_set(req)),
                    Err(r) => r,
                }
            }
            Hook::UpdateMachine => match parse::<UpdateMachineRequest>(hook, body, values) {
                Ok(req) => {
                    let r = self.update_machine(req).await;
                    let answer = Answer::of_update(&r);
                    Reply::ok((serde_json::to_value(r).unwrap_or_default(), answer))
                }
                Err(r) => r,
            },
        }
    }
}

/// The answer to a request whose path names no hook: `GET /healthz`, `405` for another
/// method under the hooks' prefix, else `404`.
fn not_a_hook(method: &str, path: &str) -> Reply {
    if method == "GET" && path == "/healthz" {
        return Reply::ok((serde_json::json!({"status": "ok"}), Answer::Nothing));
    }
    if !path.starts_with(&format!("/{API_VERSION}/")) {
        return Reply::refused(
            StatusCode::NOT_FOUND,
            serde_json::json!({"message": format!("no route {path}")}),
        );
    }
    if method != "POST" {
        return Reply::refused(
            StatusCode::METHOD_NOT_ALLOWED,
            serde_json::json!({"message": "use POST"}),
        );
    }
    Reply::refused(
        StatusCode::NOT_FOUND,
        serde_json::json!({"message": format!("no handler {path}")}),
    )
}

/// The request of `hook` from `body`, or the refusal: `413` when `values` (the body's
/// JSON value count) is over the limit, `400` when it does not parse (with the JSON path,
/// never the value: [`json_error`]).
fn parse<T: DeserializeOwned>(
    hook: Hook,
    body: &[u8],
    values: &Result<usize, String>,
) -> Result<T, Reply> {
    let kind = hook.response_kind();
    if let Err(e) = values {
        return Err(Reply::refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            failure(kind, &format!("request refused: {e}")),
        ));
    }
    serde_path_to_error::deserialize::<_, T>(&mut serde_json::Deserializer::from_slice(body))
        .map_err(|e| {
            Reply::refused(
                StatusCode::BAD_REQUEST,
                failure(
                    kind,
                    &format!(
                        "malformed {} request: {}",
                        kind.trim_end_matches("Response"),
                        json_error(&e)
                    ),
                ),
            )
        })
}

/// A request parse error with its JSON path, without the offending value: serde quotes a
/// string it did not expect (`invalid type: string "…", expected …`), and a request may
/// carry a token or file content in any field.
fn json_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let inner = e.inner().to_string();
    let inner = match (inner.split_once(": "), inner.split_once(", expected ")) {
        (Some((kind @ ("invalid type" | "invalid value"), _)), Some((_, rest))) => {
            format!("{kind}, expected {rest}")
        }
        _ => inner,
    };
    format!("{}: {inner}", e.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_path_not_the_value() {
        let body = br#"{"current": "2llldv.b7bn3izenrsfazb2", "desired": {}}"#;
        let e = serde_path_to_error::deserialize::<_, CanUpdateMachineRequest>(
            &mut serde_json::Deserializer::from_slice(body),
        )
        .unwrap_err();
        let m = json_error(&e);
        assert!(!m.contains("b7bn3izenrsfazb2"), "{m}");
        assert!(
            m.starts_with("current: invalid type, expected struct MachineObjects"),
            "{m}"
        );
    }

    /// What a request that names no hook gets, as before the hook table.
    #[test]
    fn requests_that_name_no_hook() {
        let r = not_a_hook("GET", "/healthz");
        assert_eq!(
            (r.status, r.body),
            (StatusCode::OK, serde_json::json!({"status": "ok"}))
        );
        let r = not_a_hook("POST", "/healthz");
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(r.body, serde_json::json!({"message": "no route /healthz"}));
        let under = format!("/{API_VERSION}/x/update-machine");
        let r = not_a_hook("GET", &under);
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        let r = not_a_hook("POST", &under);
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(
            r.body,
            serde_json::json!({"message": format!("no handler {under}")})
        );
    }
}
