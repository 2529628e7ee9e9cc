//! The two clocks dranet keeps apart.
//!
//! * [`MonoTime`]: CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns`, so a probe's event time
//!   and the engine's own timestamps can be subtracted. Read only by [`crate::sys::os::mono_now`].
//!   It means nothing across a reboot and is never written to the checkpoint.
//! * [`UnixSecs`]: wall-clock seconds since the Unix epoch, for what outlives the process (a
//!   record's `recovered.at`, the suffix of a corrupt file set aside). Never subtracted from a
//!   [`MonoTime`].
//!
//! Both serialize as the bare number they wrap, so the JSON is what it was when they were `u64`s.

use std::time::Duration;

/// A CLOCK_MONOTONIC timestamp in ns (the clock of `bpf_ktime_get_ns`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct MonoTime(u64);

impl MonoTime {
    /// A timestamp from a raw CLOCK_MONOTONIC ns value (a BPF event's `ktime`, the clock read).
    #[must_use]
    pub const fn from_ns(ns: u64) -> Self {
        Self(ns)
    }

    /// The raw ns value (JSON lines, arithmetic at a boundary).
    #[must_use]
    pub const fn as_ns(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is; zero when `earlier` is later (never negative).
    #[must_use]
    pub const fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Signed ns from `origin` to this (negative when this is earlier): a trace's time axis.
    #[must_use]
    pub fn offset_ns(self, origin: Self) -> i128 {
        i128::from(self.0) - i128::from(origin.0)
    }
}

impl std::fmt::Display for MonoTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// Wall-clock seconds since the Unix epoch (what outlives the process: on disk, in file names).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct UnixSecs(u64);

impl UnixSecs {
    /// The wall clock now (0 if it is before 1970).
    #[must_use]
    pub fn now() -> Self {
        Self(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        )
    }

    #[must_use]
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs)
    }

    #[must_use]
    pub const fn as_secs(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for UnixSecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_the_difference_and_never_negative() {
        let a = MonoTime::from_ns(1_000);
        let b = MonoTime::from_ns(3_500);
        assert_eq!(b.since(a), Duration::from_nanos(2_500));
        assert_eq!(a.since(b), Duration::ZERO);
        assert_eq!(a.since(a), Duration::ZERO);
        assert_eq!(
            MonoTime::from_ns(u64::MAX).since(MonoTime::default()),
            Duration::from_nanos(u64::MAX)
        );
        assert_eq!(b.offset_ns(a), 2_500);
        assert_eq!(a.offset_ns(b), -2_500);
    }

    #[test]
    fn both_serialize_as_the_bare_number() {
        assert_eq!(serde_json::to_string(&MonoTime::from_ns(42)).unwrap(), "42");
        assert_eq!(
            serde_json::from_str::<MonoTime>("42").unwrap(),
            MonoTime::from_ns(42)
        );
        assert_eq!(
            serde_json::to_string(&UnixSecs::from_secs(1_700_000_000)).unwrap(),
            "1700000000"
        );
        assert_eq!(
            serde_json::from_str::<UnixSecs>("1700000000").unwrap(),
            UnixSecs::from_secs(1_700_000_000)
        );
        assert!(serde_json::from_str::<MonoTime>("-1").is_err());
    }

    /// A rebuilt record's `recovered` on disk: `at` stays a bare number of seconds.
    #[test]
    fn recovered_keeps_its_json_on_disk() {
        let r = crate::state::Recovered {
            reason: "no record of this pin".into(),
            at: UnixSecs::from_secs(1_700_000_000),
        };
        let on_disk = r#"{"reason":"no record of this pin","at":1700000000}"#;
        assert_eq!(serde_json::to_string(&r).unwrap(), on_disk);
        assert_eq!(
            serde_json::from_str::<crate::state::Recovered>(on_disk).unwrap(),
            r
        );
    }

    /// What `dranet trace`, the bench and the activity feed read: the same JSON as when the
    /// timestamps were bare `u64`s.
    #[test]
    fn rescue_timing_and_activity_keep_their_json() {
        let t = crate::rescue::RescueTiming {
            pod_uid: "uid-1".into(),
            trigger: crate::rescue::decide::RescueTrigger::NetnsUnmounted,
            event_ns: MonoTime::from_ns(1_000),
            first_move_ns: Some(MonoTime::from_ns(1_500)),
            done_ns: MonoTime::from_ns(9_000),
            ok: true,
        };
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"pod_uid":"uid-1","trigger":"netns_unmounted","event_ns":1000,"first_move_ns":1500,"done_ns":9000,"ok":true}"#
        );
        let none = crate::rescue::RescueTiming {
            first_move_ns: None,
            ..t
        };
        assert!(
            serde_json::to_string(&none)
                .unwrap()
                .contains(r#""first_move_ns":null"#)
        );
        let a = r#"{"at":123456789,"pod_uid":"u","pod":"ns/p","netns_path":null,"kind":{"type":"hook","name":"StopPodSandbox"}}"#;
        let parsed: crate::rescue::activity::Activity = serde_json::from_str(a).unwrap();
        assert_eq!(parsed.at, MonoTime::from_ns(123_456_789));
        assert_eq!(serde_json::to_string(&parsed).unwrap(), a);
    }
}
