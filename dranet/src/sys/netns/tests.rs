use super::*;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dranet-netns-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn host_netns_opens_and_has_an_identity() {
    let a = Netns::host().unwrap();
    let b = Netns::open_path(Path::new("/proc/self/ns/net")).unwrap();
    assert_eq!(a.id(), b.id());
    assert!(a.id().cookie.is_known());
    assert_eq!(Netns::open_pid(std::process::id()).unwrap().id(), a.id());
    assert_eq!(a.try_clone().unwrap().id(), a.id());
}

#[test]
fn a_regular_file_is_refused() {
    let d = tmpdir("file");
    let f = d.join("not-a-netns");
    std::fs::write(&f, b"x").unwrap();
    let e = Netns::open_path(&f).unwrap_err();
    assert!(matches!(e, NetnsError::NotANamespace { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_directory_a_fifo_and_a_symlink_to_them_are_refused() {
    let d = tmpdir("special");
    let fifo = d.join("fifo");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
    // Opening a FIFO read-only would block forever: the O_PATH check must refuse it first.
    let e = Netns::open_path(&fifo).unwrap_err();
    assert!(
        matches!(
            e,
            NetnsError::NotANamespace {
                what: "special file",
                ..
            }
        ),
        "{e}"
    );
    let e = Netns::open_path(&d).unwrap_err();
    assert!(
        matches!(
            e,
            NetnsError::NotANamespace {
                what: "directory",
                ..
            }
        ),
        "{e}"
    );
    let link = d.join("link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    assert!(matches!(
        Netns::open_path(&link).unwrap_err(),
        NetnsError::NotANamespace { .. }
    ));
    let e = Netns::open_path(Path::new("/dev/null")).unwrap_err();
    assert!(matches!(e, NetnsError::NotANamespace { .. }), "{e}");
    let e = Netns::open_path(&d.join("absent")).unwrap_err();
    assert!(matches!(e, NetnsError::Open { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn another_namespace_type_is_refused() {
    for ns in ["mnt", "uts", "ipc"] {
        let e = Netns::open_path(&PathBuf::from(format!("/proc/self/ns/{ns}"))).unwrap_err();
        assert!(matches!(e, NetnsError::WrongType { .. }), "{ns}: {e}");
    }
    // A symlink to another namespace type is refused the same way.
    let d = tmpdir("symlink-mnt");
    let link = d.join("mnt");
    std::os::unix::fs::symlink("/proc/self/ns/mnt", &link).unwrap();
    assert!(matches!(
        Netns::open_path(&link).unwrap_err(),
        NetnsError::WrongType { .. }
    ));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn pin_names_are_checked() {
    let host = Netns::host().unwrap();
    let d = tmpdir("pin-names");
    for bad in ["", ".", "..", "a/b"] {
        assert!(
            matches!(Pin::create(&host, &d, bad).unwrap_err(), NetnsError::PinName(_)),
            "{bad:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn in_netns_runs_on_another_thread_and_returns_the_value() {
    let host = Netns::host().unwrap();
    let me = std::thread::current().id();
    let (v, other) = in_netns(&host, move || (41 + 1, std::thread::current().id())).unwrap();
    assert_eq!(v, 42);
    assert_ne!(other, me);
}

#[test]
fn pins_list_skips_hidden_files_and_missing_dirs() {
    let d = tmpdir("list");
    std::fs::write(d.join(".tmp"), b"").unwrap();
    std::fs::write(d.join("b"), b"").unwrap();
    std::fs::write(d.join("a"), b"").unwrap();
    assert_eq!(Pin::list(&d).unwrap(), vec![d.join("a"), d.join("b")]);
    assert!(Pin::list(&d.join("absent")).unwrap().is_empty());
    // A pin path with nothing mounted is not a pin.
    assert!(Pin::reopen(&d.join("a")).is_err());
    release_path(&d.join("a")).unwrap();
    assert!(!d.join("a").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_socket_fallback_finds_the_same_cookie_as_ns_get_id() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: setns needs root");
        return;
    }
    let host = Netns::host().unwrap();
    // The fallback used on kernels without NS_GET_ID (Debian 6.1) must agree with it.
    let by_socket = cookie_by_socket(host.as_fd()).unwrap();
    assert_eq!(NetnsCookie::from_raw(by_socket), cookie(host.as_fd()).unwrap());
    assert_ne!(by_socket, 0);
    // And it refuses an fd that is not a netns.
    let f = std::fs::File::open("/proc/self/ns/uts").unwrap();
    assert!(cookie_by_socket(f.as_fd()).is_err());
}

/// One operation enters a netns once: every `in_netns` on the same `Netns` runs on one worker
/// thread, a closure that asks for the same netns from inside it runs inline (no deadlock), a
/// clone has its own worker, and the worker exits when idle (the next call starts another).
#[test]
fn in_netns_enters_once_per_netns_handle_and_the_worker_exits_when_idle() {
    let host = Netns::host().unwrap();
    let tid = || format!("{:?}", std::thread::current().id());
    let first = in_netns(&host, tid).unwrap();
    let second = in_netns(&host, tid).unwrap();
    assert_eq!(first, second, "two calls on one Netns entered it twice");
    let again = host.try_clone().unwrap();
    let nested = in_netns(&host, move || {
        let outer = format!("{:?}", std::thread::current().id());
        // A nested call for another handle of the same netns runs inline on this thread.
        let inner = in_netns(&again, move || format!("{:?}", std::thread::current().id())).unwrap();
        (outer, inner)
    })
    .unwrap();
    assert_eq!(nested.0, first);
    assert_eq!(
        nested.1, first,
        "a nested call on the same netns did not run inline"
    );
    let other = host.try_clone().unwrap();
    assert_ne!(in_netns(&other, tid).unwrap(), first, "a clone shares the worker");
    std::thread::sleep(worker::IDLE * 2);
    let later = in_netns(&host, tid).unwrap();
    assert_ne!(later, first, "the worker did not exit when idle");
    // A panicking closure is an error for its caller, and the next call works.
    assert!(matches!(
        in_netns(&host, || -> u8 { panic!("boom") }),
        Err(NetnsError::ThreadPanicked(_))
    ));
    assert_eq!(in_netns(&host, || 7).unwrap(), 7);
}

/// The stand-in cookie of kernels without SO_NETNS_COOKIE (5.10; only reached there, through
/// ENOPROTOOPT, so checked here directly): the same for every fd of one netns while any of them is
/// open (they share the nsfs inode), marked as a stand-in, and different for another netns.
#[test]
fn the_inode_cookie_is_stable_while_the_netns_is_held_and_marked() {
    let held = std::fs::File::open("/proc/self/ns/net").unwrap();
    let a = inode_cookie(held.as_fd()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let again = std::fs::File::open("/proc/self/ns/net").unwrap();
    assert_eq!(
        inode_cookie(again.as_fd()).unwrap(),
        a,
        "same nsfs inode, same cookie"
    );
    assert!(a.is_stand_in());
    assert_ne!(a.raw() & !INODE_COOKIE_BIT, 0, "a change time");
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
        eprintln!("skipping the second netns: unshare needs root");
        return;
    }
    let other = std::thread::spawn(|| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
        std::fs::File::open("/proc/thread-self/ns/net").unwrap()
    })
    .join()
    .unwrap();
    let b = inode_cookie(other.as_fd()).unwrap();
    assert!(b.is_stand_in());
    let (ia, ib) = (
        nix::sys::stat::fstat(held.as_fd()).unwrap().st_ino,
        nix::sys::stat::fstat(other.as_fd()).unwrap().st_ino,
    );
    assert_ne!((a, ia), (b, ib), "two live netns, two identities");
}

#[test]
fn made_at_is_when_the_netns_was_first_opened_and_none_off_nsfs() {
    assert_eq!(made_at(Path::new("/")), None, "/ is not on nsfs");
    assert_eq!(made_at(Path::new("/nonexistent-dranet-path")), None);
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
        eprintln!("skipping: unshare needs root");
        return;
    }
    // The coarse clock of inode times lags the fine one by up to a tick.
    let slack = std::time::Duration::from_millis(20);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before = std::time::SystemTime::now();
    let held = std::thread::spawn(|| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
        std::fs::File::open("/proc/thread-self/ns/net").unwrap()
    })
    .join()
    .unwrap();
    let after = std::time::SystemTime::now();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let path = format!("/proc/self/fd/{}", held.as_raw_fd());
    let t = made_at(Path::new(&path)).unwrap();
    assert!(
        t + slack >= before && t <= after + slack,
        "made at {t:?}, opened between {before:?} and {after:?}"
    );
    // Read again later: the same time while the netns is held (not the time of the read).
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(made_at(Path::new(&path)), Some(t));
}

/// The cookie is the bare number in JSON (records on disk, `dranet trace`), 0 included: a probe's
/// netns on a kernel before 5.12 that the watcher did not know.
#[test]
fn a_netns_id_keeps_its_json_and_cookie_zero_is_unknown() {
    let id = NetnsId::test(7, 4_026_532_000);
    let json = r#"{"cookie":7,"inode":4026532000}"#;
    assert_eq!(serde_json::to_string(&id).unwrap(), json);
    assert_eq!(serde_json::from_str::<NetnsId>(json).unwrap(), id);
    let unknown: NetnsId = serde_json::from_str(r#"{"cookie":0,"inode":5}"#).unwrap();
    assert_eq!(unknown.cookie, NetnsCookie::UNKNOWN);
    assert!(!unknown.cookie.is_known());
    assert!(id.cookie.is_known() && !id.cookie.is_stand_in());
    assert!(NetnsCookie::from_raw(INODE_COOKIE_BIT | 5).is_stand_in());
    assert_eq!(id.to_string(), "netns:[4026532000]/cookie 7");
}
