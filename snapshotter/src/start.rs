//! How a running fork came to be in its snapshot's state (rows record it).

/// How a running fork came to be in its snapshot's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema), schema(as = VmStart))]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// A new QEMU process loaded the snapshot (from a warm pool or not).
    #[default]
    Fork,
    /// A VM that had run before was reset in place to the snapshot ([`Fork::reset`]).
    Reset,
    /// A reset in place failed (its error in [`Fork::reset_error`]); a new fork instead.
    ResetFailed,
}

impl Start {
    pub fn as_str(self) -> &'static str {
        match self {
            Start::Fork => "fork",
            Start::Reset => "reset",
            Start::ResetFailed => "reset_failed",
        }
    }
}
