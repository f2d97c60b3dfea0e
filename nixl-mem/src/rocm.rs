//! ROCm (placeholder while written).
