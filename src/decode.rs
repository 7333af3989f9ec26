//! Bytes → capture (being written).

/// A decoded capture that owns its bytes (being written).
#[derive(Debug, Clone, Default)]
pub struct OwnedCapture {}
