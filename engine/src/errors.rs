//! Errors as a row's `error` text.

/// An error and its causes on one line (`what failed: why: why`), for a row's `error` text.
pub use vmm::describe;
