//! Per-call algorithm selection.
