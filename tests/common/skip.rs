// Shared by the test binaries: what a test does when this machine lacks what it needs.

/// Says why a test cannot run here. Under `CI=true` that is a failure, never a pass: `.ci/run` installs or
/// fetches what every test needs first, so a missing tool there is a broken gate. Elsewhere the test says so on
/// stderr (`cargo test -- --nocapture` shows it) and returns.
#[allow(dead_code)]
pub fn cannot_run(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("cannot run under CI=true, and a gate never passes by skipping: {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// The refresh switch `name` (UPDATE_GOLDEN, UPDATE_DOCS): on only for the value `1`, and refused under
/// `CI=true`, where a refresh would turn every mismatch into a pass.
#[allow(dead_code)]
pub fn refresh_requested(name: &str) -> bool {
    match std::env::var(name) {
        Ok(v) if v == "1" => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{name}=1 is refused under CI=true: a refresh would turn every mismatch into a pass");
            }
            true
        }
        Ok(v) => panic!("{name}={v:?}: only {name}=1 refreshes the expected files"),
        Err(_) => false,
    }
}
