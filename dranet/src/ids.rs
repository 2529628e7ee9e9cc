//! Identifiers that come from outside (the runtime, kubelet, a claim) and end up in file names,
//! checkpoint keys or log lines: checked once, at the boundary, before anything is built from
//! them.
//!
//! * A pod UID is a UUID (what the API server assigns), or failing that a Kubernetes object name
//!   (DNS subdomain: static pods and test harnesses use those).
//! * A sandbox id is what runtimes use: 64 hex digits for containerd and CRI-O; any
//!   `[A-Za-z0-9_.-]`, 1–128 bytes, not starting with `.`, is accepted.

/// An identifier refused at the boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("pod UID {0:?} is neither a UUID nor a Kubernetes name")]
    PodUid(String),
    #[error("sandbox id {0:?} is not a runtime sandbox id ([A-Za-z0-9_.-], 1-128 bytes, no leading '.')")]
    Sandbox(String),
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A DNS subdomain (RFC 1123): lowercase alphanumerics, `-` and `.`, at most 253 bytes, every
/// label starting and ending with an alphanumeric.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// A pod UID checked at the boundary ([`pod_uid`]): a UUID or a Kubernetes name, never `/`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(String);

/// A runtime sandbox id checked at the boundary ([`sandbox_id`]): `[A-Za-z0-9_.-]`, 1-128
/// bytes, no leading `.`, never `/`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SandboxId(String);

macro_rules! str_id {
    ($t:ty) => {
        impl $t {
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl std::ops::Deref for $t {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}
str_id!(PodUid);
str_id!(SandboxId);

/// An ifindex in the host netns: what a device had before it went to a pod, and what a move home
/// asks for. 0 means unknown (a record rebuilt from a pin never saw the device at home), never a
/// device; on disk a plain number.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct HostIfindex(u32);

/// An ifindex in a pod's netns: where a device sits while it is attached. It names a device only
/// together with that netns; on disk a plain number.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct PodIfindex(u32);

macro_rules! ifindex {
    ($t:ty) => {
        impl $t {
            #[must_use]
            pub const fn new(index: u32) -> Self {
                Self(index)
            }
            /// The number the kernel takes (netlink, ioctl).
            #[must_use]
            pub const fn get(self) -> u32 {
                self.0
            }
            /// False for 0, which no device has.
            #[must_use]
            pub const fn is_known(self) -> bool {
                self.0 != 0
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}
ifindex!(HostIfindex);
ifindex!(PodIfindex);

impl PodIfindex {
    /// The index in the pod that a device's host index would be: the attach asks the kernel to
    /// keep the device's index across the move (it does when the pod has that index free).
    #[must_use]
    pub const fn same_as(host: HostIfindex) -> Self {
        Self(host.0)
    }
}

/// Checks a pod UID before any path or key is built from it; the checked UID.
pub fn pod_uid(uid: &str) -> Result<PodUid, IdError> {
    if is_uuid(uid) || is_dns_subdomain(uid) {
        Ok(PodUid(uid.to_owned()))
    } else {
        Err(IdError::PodUid(uid.to_owned()))
    }
}

/// Checks a runtime sandbox id before any path or key is built from it; the checked id.
pub fn sandbox_id(id: &str) -> Result<SandboxId, IdError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(SandboxId(id.to_owned()))
    } else {
        Err(IdError::Sandbox(id.to_owned()))
    }
}

/// A name the kernel takes for a netdev (`dev_valid_name`): 1 to 15 bytes (`IFNAMSIZ - 1`), not
/// `.` or `..`, no `/`, `:` or whitespace (and printable here).
#[must_use]
pub fn is_ifname(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_names_as_the_kernel_takes_them() {
        for ok in [
            "eth1",
            "ens1f0np0",
            "net1",
            "a",
            "dn123",
            "eth0.100",
            "abcdefghijklmno",
        ] {
            assert!(is_ifname(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "abcdefghijklmnop",
            "pci-0000-00-05-0",
            "é",
        ] {
            assert!(!is_ifname(bad), "{bad}");
        }
    }

    #[test]
    fn an_ifindex_is_a_plain_number_on_disk() {
        let pod = PodIfindex::new(7);
        assert_eq!(serde_json::to_string(&pod).unwrap(), "7");
        assert_eq!(serde_json::from_str::<PodIfindex>("7").unwrap(), pod);
        assert_eq!(serde_json::to_string(&HostIfindex::new(0)).unwrap(), "0");
        assert!(!HostIfindex::new(0).is_known() && HostIfindex::new(3).is_known());
        assert_eq!(PodIfindex::same_as(HostIfindex::new(3)), PodIfindex::new(3));
        assert_eq!(pod.to_string(), "7");
    }

    #[test]
    fn pod_uids() {
        for ok in [
            "0f6e2d4a-1b2c-4d5e-8f90-a1b2c3d4e5f6",
            "0F6E2D4A-1B2C-4D5E-8F90-A1B2C3D4E5F6",
            "uid-1",
            "e2e-pod-abc12",
            "static-pod.node-a",
        ] {
            assert_eq!(pod_uid(ok).map(|u| u.to_string()), Ok(ok.to_owned()), "{ok}");
        }
        for bad in [
            "",
            "/",
            "..",
            ".",
            "../../etc",
            "/etc/passwd",
            "a/b",
            "a b",
            "UPPER",
            "-lead",
            "trail-",
            "a..b",
            "x\0y",
            &"a".repeat(254),
        ] {
            assert!(pod_uid(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sandbox_ids() {
        for ok in [
            "4b8f0c9e2d1a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a2918076ab",
            "sb-uid-1",
            "sb_1.a",
        ] {
            assert_eq!(sandbox_id(ok).map(|s| s.to_string()), Ok(ok.to_owned()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "/abs",
            "a b",
            "a%d",
            &"a".repeat(129),
        ] {
            assert!(sandbox_id(bad).is_err(), "{bad:?} accepted");
        }
    }
}
