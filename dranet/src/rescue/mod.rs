//! rescue
