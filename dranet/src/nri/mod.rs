//! nri
