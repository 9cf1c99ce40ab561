//! Errors as a row's `error` text.

/// An error and its causes on one line (`what failed: why: why`), for a row's `error` text.
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}
