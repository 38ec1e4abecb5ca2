//! The schedule simulator.
