//! Event type registry (being written).

/// Event id → name (being written).
#[derive(Debug, Clone, Default)]
pub struct EventRegistry {}
