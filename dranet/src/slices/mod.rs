//! slices
