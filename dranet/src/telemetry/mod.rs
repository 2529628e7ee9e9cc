//! Telemetry: log set-up ([`log`]), the one way an error is written out ([`chain`]), every
//! metric family dranet exports ([`metrics`]) and what this binary is ([`version`]).
//!
//! Error types keep their cause out of their own message (`#[source]` only), so an error is
//! written once, where it is handled, as its whole chain: `what failed: why: why…`.

pub mod log;
pub mod metrics;
pub mod version;

use std::error::Error;
use std::fmt;

/// Displays an error and every cause after it, `: `-separated.
#[derive(Clone, Copy)]
pub struct Chain<'a>(&'a (dyn Error + 'a));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(c) = cur {
            write!(f, ": {c}")?;
            cur = c.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `e` with its causes, for a log field (`error = %chain(&e)`), a message to a peer or a status.
#[must_use]
pub fn chain<'a>(e: &'a (dyn Error + 'a)) -> Chain<'a> {
    Chain(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer {n}")]
    struct Outer {
        n: u32,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_chain_names_every_cause_once() {
        let e = Outer {
            n: 1,
            source: std::io::Error::other("inner"),
        };
        assert_eq!(chain(&e).to_string(), "outer 1: inner");
    }
}
