//! Ring and tree orders searched on the link graph.
