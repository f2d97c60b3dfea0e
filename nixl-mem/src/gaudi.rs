//! Gaudi (placeholder while written).
