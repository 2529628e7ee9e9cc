//! dra
