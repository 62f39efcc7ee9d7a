use super::*;
use crate::capi::types::HANDLERS;

/// `metrics::hook_of` before the table: the hook a path names, by suffix.
fn old_hook_of(path: &str) -> &'static str {
    if path.ends_with("/can-update-machineset") {
        "CanUpdateMachineSet"
    } else if path.ends_with("/can-update-machine") {
        "CanUpdateMachine"
    } else if path.ends_with("/update-machine") {
        "UpdateMachine"
    } else {
        "Discovery"
    }
}

fn full(h: Hook) -> String {
    format!("/{API_VERSION}/{}", h.row().path)
}

#[test]
fn every_hook_is_found_at_its_path_and_nowhere_else() {
    for h in Hook::ALL {
        assert_eq!(Hook::of_path(&full(h)), Some(h));
        assert_eq!(old_hook_of(&full(h)), h.label());
        assert_eq!(h.response_kind(), format!("{}Response", h.label()));
    }
    for path in [
        "/healthz",
        "/discovery",
        "/updatemachine/update-machine",
        &format!("/{API_VERSION}"),
        &format!("/{API_VERSION}/"),
        &format!("/{API_VERSION}/x/update-machine"),
        &format!("/{API_VERSION}/updatemachine/update-machine/"),
        &format!("{API_VERSION}/discovery"),
    ] {
        assert_eq!(Hook::of_path(path), None, "{path}");
    }
}

/// The discovery answer registers exactly the table's handlers, at the table's paths
/// (`<hook lowercased>/<handler name>`).
#[test]
fn the_table_is_what_discovery_registers() {
    for (hook, name) in HANDLERS {
        let path = format!("/{API_VERSION}/{}/{name}", hook.to_lowercase());
        let h = Hook::of_path(&path).expect(hook);
        assert_eq!(h.label(), hook);
    }
    assert_eq!(HANDLERS.len() + 1, Hook::ALL.len());
}

#[test]
fn timeout_answers_are_the_old_ones() {
    let why = "the node agent did not answer within the hook's deadline (1s)";
    let (v, a) = Hook::UpdateMachine.timeout_answer(why, 30);
    let old = serde_json::to_value(UpdateMachineResponse::new(
        Status::Success,
        format!("waiting: {why}"),
        30,
    ))
    .unwrap();
    assert_eq!(v.to_string(), old.to_string());
    assert_eq!(a, Answer::InProgress);
    assert_eq!(Hook::UpdateMachine.timeout_answer(why, 0).1, Answer::Done);
    for (h, kind) in [
        (Hook::CanUpdateMachine, "CanUpdateMachineResponse"),
        (Hook::CanUpdateMachineSet, "CanUpdateMachineSetResponse"),
    ] {
        let (v, a) = h.timeout_answer(why, 30);
        let old = failure(kind, &format!("{why}; CAPI will retry"));
        assert_eq!(v.to_string(), old.to_string());
        assert_eq!(a, Answer::Failure);
    }
}

/// `metrics::answer_of` before the answers were typed, for UpdateMachine.
fn old_update_answer(v: &Value) -> &'static str {
    if v["status"] == "Failure" {
        "failure"
    } else if v["retryAfterSeconds"].as_i64().unwrap_or(0) > 0 {
        "in_progress"
    } else {
        "done"
    }
}

#[test]
fn update_machine_answers_are_labelled_as_before() {
    for (status, retry) in [
        (Status::Success, 0),
        (Status::Success, 30),
        (Status::Failure, 0),
    ] {
        let r = UpdateMachineResponse::new(status, "m", retry);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(Answer::of_update(&r).label(), old_update_answer(&v));
    }
    let labels: Vec<&str> = [
        Answer::Covered,
        Answer::NotCovered,
        Answer::Preserve,
        Answer::Nothing,
        Answer::InProgress,
        Answer::Done,
        Answer::Failure,
    ]
    .iter()
    .map(|a| a.label())
    .collect();
    assert_eq!(
        labels,
        [
            "covered",
            "not_covered",
            "preserve",
            "nothing",
            "in_progress",
            "done",
            "failure"
        ]
    );
}

/// While a timed try waits for its Node, CAPI is asked back within the try: half the
/// seconds left (at least 1), never later than `retryAfterSeconds`.
#[test]
fn a_waiting_try_is_asked_back_before_its_deadline() {
    use super::driver::retry_within_try;
    assert_eq!(retry_within_try(30, Some(9)), 4);
    assert_eq!(retry_within_try(30, Some(1)), 1);
    assert_eq!(retry_within_try(30, Some(0)), 1);
    assert_eq!(retry_within_try(30, Some(600)), 30);
    assert_eq!(retry_within_try(30, None), 30);
}
