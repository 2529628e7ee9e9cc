//! Network namespace handles: open by path or pid, verify, identify, pin. (Fenced: touches the
//! kernel.)

use std::fmt;

use serde::{Deserialize, Serialize};

/// Identity of a network namespace: the 64-bit netns cookie (never reused while the system runs)
/// plus the nsfs inode number (reused at once after the netns dies, so never a key on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NetnsId {
    pub cookie: u64,
    pub inode: u64,
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "netns:[{}]/cookie {}", self.inode, self.cookie)
    }
}
