//! What a test does when this machine lacks what it needs, and the refresh switch of expected files.

/// Says why a test cannot run here. Under `CI=true` that is a failure, never a pass: `.ci/run` installs or
/// fetches what every test needs first, so a missing tool there is a broken gate. Elsewhere the test says so on
/// stderr (`cargo test -- --nocapture` shows it) and returns.
pub fn cannot_run(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("cannot run under CI=true, and a gate never passes by skipping: {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// The refresh switch of every expected file (tests/golden, docs/examples, the docs' embedded blocks):
/// `UPDATE_GOLDEN=1`, refused under `CI=true`, where a refresh would turn every mismatch into a pass.
pub fn refreshing() -> bool {
    if let Ok(v) = std::env::var("UPDATE_DOCS") {
        panic!(
            "UPDATE_DOCS={v:?}: the one refresh switch is UPDATE_GOLDEN=1 (goldens and docs alike)"
        );
    }
    match std::env::var("UPDATE_GOLDEN") {
        Ok(v) if v == "1" => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "UPDATE_GOLDEN=1 is refused under CI=true: a refresh would turn every mismatch into a pass"
                );
            }
            true
        }
        Ok(v) => panic!("UPDATE_GOLDEN={v:?}: only UPDATE_GOLDEN=1 refreshes the expected files"),
        Err(_) => false,
    }
}
