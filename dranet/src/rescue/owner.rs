//! Whose lock an engine action takes, and whom its errors, logs and activity name.

use crate::ids::PodUid;
use crate::state::PodRecord;

/// The owner of a sandbox record: its pod, or nobody known yet for a record rebuilt from a pin
/// that no hook, Synchronize or adoption has named ([`crate::state::PodRecord::uid`] is
/// `None`). The engine's per-pod lock is keyed by it: every sandbox of a pod shares one lock,
/// and the unnamed records share another (few; only the start-up rebuild makes them, and the
/// naming step takes that lock besides the pod's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    Pod(PodUid),
    Unnamed,
}

impl Owner {
    /// The owner of record `r`.
    #[must_use]
    pub fn of(r: &PodRecord) -> Self {
        r.uid().map_or(Self::Unnamed, Self::Pod)
    }

    /// The pod, when one is known.
    #[must_use]
    pub fn uid(&self) -> Option<&PodUid> {
        match self {
            Self::Pod(u) => Some(u),
            Self::Unnamed => None,
        }
    }

    /// The owner a feed's pod UID names ([`Owner::uid_str`]: empty for the unnamed records);
    /// `None` for a string that is neither.
    #[must_use]
    pub fn from_feed(uid: &str) -> Option<Self> {
        if uid.is_empty() {
            return Some(Self::Unnamed);
        }
        crate::ids::pod_uid(uid).ok().map(Self::Pod)
    }

    /// The pod UID as the activity feed and the rescue timing carry it (empty: unnamed, as the
    /// record has it on disk).
    #[must_use]
    pub fn uid_str(&self) -> &str {
        self.uid().map_or("", PodUid::as_str)
    }
}

impl From<PodUid> for Owner {
    fn from(u: PodUid) -> Self {
        Self::Pod(u)
    }
}

impl From<&PodUid> for Owner {
    fn from(u: &PodUid) -> Self {
        Self::Pod(u.clone())
    }
}

impl From<&Owner> for Owner {
    fn from(o: &Owner) -> Self {
        o.clone()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pod(u) => f.write_str(u),
            Self::Unnamed => f.write_str("(unnamed: rebuilt from a pin)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uid: &str, sandbox: &str) -> PodRecord {
        serde_json::from_value(serde_json::json!({
            "pod_uid": uid,
            "sandbox_id": sandbox,
            "namespace": "",
            "name": "",
            "netns_path": "/run/netns/x",
            "netns": {"cookie": 7, "inode": 4026532001_u64},
            "pin": null,
            "phase": "attached",
            "devices": [],
        }))
        .unwrap()
    }

    #[test]
    fn a_record_is_owned_by_its_pod_or_by_nobody_known() {
        let named = record("uid-1", "sb-1");
        assert_eq!(named.uid().map(|u| u.to_string()), Some("uid-1".to_owned()));
        assert_eq!(named.sandbox().map(|s| s.to_string()), Some("sb-1".to_owned()));
        let owner = Owner::of(&named);
        assert_eq!(owner.uid_str(), "uid-1");
        assert_eq!(owner.to_string(), "uid-1");

        let rebuilt = record("", "sb-2");
        assert_eq!(rebuilt.uid(), None);
        let owner = Owner::of(&rebuilt);
        assert_eq!(owner, Owner::Unnamed);
        assert_eq!(
            owner.uid_str(),
            "",
            "the activity feed keeps the record's empty UID"
        );
        assert_ne!(owner.to_string(), "", "errors and logs say who, not nothing");

        let legacy = record("uid-3", "");
        assert_eq!(legacy.sandbox(), None);
        assert_eq!(Owner::of(&legacy).uid_str(), "uid-3");
    }
}
