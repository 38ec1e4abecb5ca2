//! Text and picture renderings of a topology.
