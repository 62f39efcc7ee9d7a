//! `inplacectl apply --try DURATION` parsing, black box: an out-of-range or overflowing
//! window is a usage error naming the flag and its range, never a panic.

use std::process::Command;

fn ctl_try(window: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_inplacectl"))
        .args([
            "--socket",
            "/nonexistent/inplaced.sock",
            "apply",
            "--file",
            "spec.yaml",
            "--try",
            window,
        ])
        .output()
        .expect("run inplacectl")
}

#[test]
fn an_overflowing_try_window_is_a_range_error_not_a_panic() {
    for window in [
        "5124095576030432h",
        "18446744073709551615h",
        "99999999999999999999",
        "25h",
        "0",
    ] {
        let o = ctl_try(window);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{window}: {err}");
        assert!(!err.contains("panicked"), "{window}: {err}");
        assert!(
            err.contains("--try") && err.contains("1 s to 24 h"),
            "{window}: {err}"
        );
    }
}
