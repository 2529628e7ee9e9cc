//! Parsing the guest's serial log: the guest script prints one
//! `VMTEST <PASS|FAIL|SKIP|NOTDONE|KNOWN> <case> <seconds>s <detail>` line per case and `VMTEST END`.

/// One case's verdict.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
    NotDone,
    /// A known limitation of a kernel or of a probe, documented in the README; does not fail
    /// the run, but is printed with its detail.
    Known,
}

/// One case as reported by the guest.
#[derive(Debug, PartialEq, Clone)]
pub struct Case {
    pub verdict: Verdict,
    pub name: String,
    pub seconds: f64,
    pub detail: String,
}

/// What the log says.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    pub cases: Vec<Case>,
    /// The guest reached the end of its script.
    pub finished: bool,
    /// A kernel panic or oops was printed.
    pub kernel_trouble: Option<String>,
    /// The guest kernel itself stopped making progress: a soft lockup or an RCU stall (its first
    /// line). Seen once in about 35 CI runs, on 6.1 under TCG with 2 vCPUs, both vCPUs stuck
    /// while `dranet` attached its BPF trampolines; not something a test case can cause.
    pub hang: Option<String>,
}

impl Verdict {
    /// The word the guest prints.
    pub fn word(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
            Self::NotDone => "NOTDONE",
            Self::Known => "KNOWN",
        }
    }
}

impl Report {
    /// True when the guest finished and no case failed.
    pub fn ok(&self) -> bool {
        self.finished && !self.cases.iter().any(|c| c.verdict == Verdict::Fail)
    }

    /// Why this boot is worth one more: the guest never finished because its kernel hung
    /// (and no case had failed before it did). Any other failure stands as it is.
    pub fn retry_because(&self) -> Option<&str> {
        if self.finished || self.cases.iter().any(|c| c.verdict == Verdict::Fail) {
            return None;
        }
        self.hang.as_deref()
    }
}

/// Parses the log (tolerates `\r`, console noise before the marker, kernel messages between).
pub fn parse(log: &str) -> Report {
    let mut r = Report::default();
    for raw in log.lines() {
        let line = raw.trim_end_matches('\r');
        if r.kernel_trouble.is_none()
            && (line.contains("Kernel panic") || line.contains("BUG: ") || line.contains("Oops:"))
        {
            r.kernel_trouble = Some(line.trim().to_owned());
        }
        if r.hang.is_none() && (line.contains("soft lockup") || line.contains("detected stalls on CPUs")) {
            r.hang = Some(line.trim().to_owned());
        }
        let Some(at) = line.find("VMTEST ") else { continue };
        let rest = &line[at + "VMTEST ".len()..];
        let mut words = rest.splitn(4, ' ');
        let verdict = match words.next() {
            Some("END") => {
                r.finished = true;
                continue;
            }
            Some("PASS") => Verdict::Pass,
            Some("FAIL") => Verdict::Fail,
            Some("SKIP") => Verdict::Skip,
            Some("NOTDONE") => Verdict::NotDone,
            Some("KNOWN") => Verdict::Known,
            _ => continue,
        };
        let Some(name) = words.next() else { continue };
        let seconds = words
            .next()
            .and_then(|s| s.strip_suffix('s'))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        r.cases.push(Case {
            verdict,
            name: name.to_owned(),
            seconds,
            detail: words.next().unwrap_or("").trim().to_owned(),
        });
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_and_end_are_found_among_console_noise() {
        let log = "[    1.0] virtio_net virtio1 eth1: renamed\r\n\
                   VMTEST PASS trace-tier-b 12.5s device_moving=1 netns_released=1\r\n\
                   [   40.2] random: crng init done\n\
                   garbage VMTEST FAIL nic-return 3s eth1 came back UP\n\
                   VMTEST NOTDONE rdma-exclusive 0s needs 7.3\n\
                   VMTEST BOGUS x\n\
                   VMTEST END\n";
        let r = parse(log);
        assert!(r.finished);
        assert_eq!(r.cases.len(), 3);
        assert_eq!(r.cases[0].verdict, Verdict::Pass);
        assert_eq!(r.cases[0].name, "trace-tier-b");
        assert!((r.cases[0].seconds - 12.5).abs() < 1e-9);
        assert_eq!(r.cases[0].detail, "device_moving=1 netns_released=1");
        assert_eq!(r.cases[1].verdict, Verdict::Fail);
        assert_eq!(r.cases[1].detail, "eth1 came back UP");
        assert_eq!(r.cases[2].verdict, Verdict::NotDone);
        assert_eq!(r.cases[2].verdict.word(), "NOTDONE");
        assert!(!r.ok(), "a FAIL makes the run fail");
        assert_eq!(r.kernel_trouble, None);
    }

    #[test]
    fn a_log_without_end_or_with_a_panic_is_not_ok() {
        let r = parse("VMTEST PASS a 1s\n[ 9.1] Kernel panic - not syncing: Attempted to kill init!\n");
        assert!(!r.finished);
        assert!(!r.ok());
        assert!(
            r.kernel_trouble
                .as_deref()
                .is_some_and(|t| t.contains("Kernel panic"))
        );
        let good = parse("VMTEST PASS a 1s\nVMTEST SKIP b 0s n/a\nVMTEST END\n");
        assert!(good.ok());
        assert_eq!(r.retry_because(), None, "a panic is not a hang: it stands");
    }

    #[test]
    fn a_guest_kernel_hang_earns_one_more_boot_and_nothing_else_does() {
        let hung = parse(
            "VMTEST NOTDONE trace 0s not in this boot\n\
             [   30.7] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n\
             [   36.7] watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [sleep:169]\n\
             [   36.8] Kernel panic - not syncing: softlockup: hung tasks\n",
        );
        assert!(!hung.ok());
        assert!(
            hung.retry_because()
                .is_some_and(|w| w.contains("detected stalls"))
        );
        let lockup_only = parse("[ 36.7] watchdog: BUG: soft lockup - CPU#1 stuck for 44s! [dranet:141]\n");
        assert!(
            lockup_only
                .retry_because()
                .is_some_and(|w| w.contains("soft lockup"))
        );
        // A case that failed before the hang fails the run; a finished guest is judged as is.
        let failed_first =
            parse("VMTEST FAIL lsm-sb-umount 3s no event\n[ 40.0] watchdog: BUG: soft lockup - CPU#0\n");
        assert_eq!(failed_first.retry_because(), None);
        let finished = parse("[ 5.0] watchdog: BUG: soft lockup - CPU#0\nVMTEST PASS a 1s\nVMTEST END\n");
        assert_eq!(finished.retry_because(), None);
        // A timeout with no sign of a kernel hang stands.
        assert_eq!(parse("VMTEST PASS a 1s\n").retry_because(), None);
    }
}
