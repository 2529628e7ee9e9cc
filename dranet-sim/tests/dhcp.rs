//! Root tests of the DHCPv4 client (`dranet::dhcp`) on the real kernel: a veth pair between two
//! test netns, a real `dnsmasq` (installed by scripts/install-toolchain.sh) on one end, the
//! client on the other; a scripted server (our own codec over a UDP socket) for NAK and
//! unusable ACKs; no server at all for the timeout; and Prepare taking the lease into the plan.
//! Everything is removed by guards (dnsmasq killed, netns unmounted, so the veth dies too).

#![expect(
    clippy::unwrap_used,
    reason = "test helpers panic on setup failure, like the tests"
)]

use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::dhcp::message::{Message, MessageType, opt};
use dranet::dhcp::{ClasslessRoute, Client, DhcpError};
use dranet::dra::{MemoryClaimSource, Preparer, ResourceClaim};
use dranet::ids::{HostIfindex, PodIfindex};
use dranet::inventory::{Device, SharedInventory};
use dranet::plan::ClaimRef;
use dranet::sys::netns::Netns;
use dranet_sim::fixtures::RecordingSink;
use dranet_sim::kernel::{PodNetns, require_root, sh, unique};
use dranet_sim::root_or_skip;
use serde_json::json;

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// Root and dnsmasq, or skip (printed) outside CI; under `CI=true` both are required.
fn require_root_and_dnsmasq(test: &str) -> Result<bool> {
    if !require_root(test)? {
        return Ok(false);
    }
    if dnsmasq_bin().is_some() {
        return Ok(true);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!(
            "{test} needs dnsmasq (scripts/install-toolchain.sh installs dnsmasq-base; CI=true: refusing to skip)"
        );
    }
    eprintln!("skipping {test}: dnsmasq not installed (scripts/install-toolchain.sh)");
    Ok(false)
}

fn dnsmasq_bin() -> Option<PathBuf> {
    ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Two test netns joined by a veth: `srv_if` (10.77.0.1/24, up) in `srv`, `cli_if` (down, no
/// address) in `cli`. Dropping the netns kills the veth.
struct Lab {
    cli_if: String,
    srv_if: String,
    // Dropped last (fields drop in order): the netns after anything running in them.
    cli: PodNetns,
    srv: PodNetns,
}

impl Lab {
    fn new() -> Result<Self> {
        let srv = PodNetns::create(&unique("dhs"))?;
        let cli = PodNetns::create(&unique("dhc"))?;
        let srv_if = unique("dsv");
        let cli_if = unique("dcl");
        sh(&[
            "ip", "link", "add", &srv_if, "netns", &srv.name, "type", "veth", "peer", "name", &cli_if,
            "netns", &cli.name,
        ])?;
        srv.ip(&["addr", "add", &format!("{SERVER_IP}/24"), "dev", &srv_if])?;
        srv.ip(&["link", "set", &srv_if, "up"])?;
        Ok(Self {
            cli_if,
            srv_if,
            cli,
            srv,
        })
    }

    fn client(&self, timeout: Duration) -> Client {
        Client::in_netns(Netns::open_path(&self.cli.path).unwrap(), timeout)
    }

    /// Admin state of the client end (IFF_UP in `ip link` flags).
    fn cli_up(&self) -> bool {
        let out = self.cli.ip(&["-o", "link", "show", &self.cli_if]).unwrap();
        let flags = out.split('<').nth(1).unwrap().split('>').next().unwrap();
        flags.split(',').any(|f| f == "UP")
    }

    fn cli_mac(&self) -> String {
        let out = self.cli.ip(&["-o", "link", "show", &self.cli_if]).unwrap();
        out.split("link/ether ").nth(1).unwrap()[..17].to_owned()
    }

    /// IPv4 addresses on the client end (the client must never configure any itself).
    fn cli_v4_addrs(&self) -> String {
        self.cli
            .ip(&["-4", "-o", "addr", "show", "dev", &self.cli_if])
            .unwrap()
    }
}

/// dnsmasq in the server netns on `srv_if`, killed (and its files removed) at drop.
struct Dnsmasq {
    child: Child,
    dir: PathBuf,
}

impl Dnsmasq {
    fn start(lab: &Lab, extra: &[&str]) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique("dranet-dnsmasq-"));
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::File::create(dir.join("log"))?;
        let bin = dnsmasq_bin().context("dnsmasq")?;
        let mut args: Vec<String> = vec![
            "netns".into(),
            "exec".into(),
            lab.srv.name.clone(),
            bin.display().to_string(),
            "--keep-in-foreground".into(),
            "--log-facility=-".into(),
            "--log-dhcp".into(),
            "--conf-file=/dev/null".into(),
            "--port=0".into(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--user=root".into(),
            format!("--interface={}", lab.srv_if),
            "--bind-interfaces".into(),
            "--dhcp-authoritative".into(),
            format!("--dhcp-leasefile={}", dir.join("leases").display()),
            format!("--pid-file={}", dir.join("pid").display()),
            "--dhcp-range=10.77.0.50,10.77.0.60,255.255.255.0,1h".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let child = Command::new("ip")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning dnsmasq")?;
        let mut d = Self { child, dir };
        d.wait_listening(&lab.srv)?;
        Ok(d)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn leases(&self) -> String {
        std::fs::read_to_string(self.dir.join("leases")).unwrap_or_default()
    }

    /// Until a socket on UDP port 67 (0x0043) exists in the server netns.
    fn wait_listening(&mut self, srv: &PodNetns) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait()? {
                bail!("dnsmasq exited ({st}): {}", self.log());
            }
            let udp = sh(&["ip", "netns", "exec", &srv.name, "cat", "/proc/net/udp"])?;
            if udp
                .lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(1).is_some_and(|a| a.ends_with(":0043")))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("dnsmasq not listening after 10 s: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsmasq_lease_gives_address_prefix_and_classless_routes() -> Result<()> {
    if !require_root_and_dnsmasq("dnsmasq_lease_gives_address_prefix_and_classless_routes")? {
        return Ok(());
    }
    let lab = Lab::new()?;
    let dns = Dnsmasq::start(
        &lab,
        &[
            "--dhcp-option=121,192.168.50.0/24,10.77.0.1,10.99.0.0/16,0.0.0.0,0.0.0.0/0,10.77.0.254",
            "--dhcp-option=3,10.77.0.253",
        ],
    )?;
    assert!(!lab.cli_up(), "the client end starts down");
    // Strict reverse-path filtering in the client netns (as many hosts have it): replies to a
    // device without an address would be dropped on the UDP path; the packet socket gets them.
    for key in ["all", lab.cli_if.as_str()] {
        sh(&[
            "ip",
            "netns",
            "exec",
            &lab.cli.name,
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.{key}.rp_filter=1"),
        ])?;
    }
    let t0 = Instant::now();
    let lease = lab
        .client(Duration::from_secs(5))
        .lease(&lab.cli_if)
        .await
        .with_context(|| format!("dnsmasq log:\n{}", dns.log()))?;
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    let host = lease.address.octets();
    assert_eq!(&host[..3], &[10, 77, 0], "{lease:?}");
    assert!((50..=60).contains(&host[3]), "{lease:?}");
    assert_eq!(lease.prefix_len, 24);
    assert_eq!(lease.server, Some(SERVER_IP));
    assert_eq!(lease.lease_secs, Some(3600));
    assert_eq!(
        lease.routes,
        [
            ClasslessRoute {
                destination: Ipv4Addr::new(192, 168, 50, 0),
                prefix_len: 24,
                router: SERVER_IP,
            },
            ClasslessRoute {
                destination: Ipv4Addr::new(10, 99, 0, 0),
                prefix_len: 16,
                router: Ipv4Addr::UNSPECIFIED,
            },
            ClasslessRoute {
                destination: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                router: Ipv4Addr::new(10, 77, 0, 254),
            },
        ]
    );
    // Reported, not turned into a route (as upstream).
    assert_eq!(lease.routers, [Ipv4Addr::new(10, 77, 0, 253)]);
    let routes: Vec<(String, String, u8)> = lease
        .route_configs()
        .into_iter()
        .map(|r| (r.destination, r.gateway, r.scope))
        .collect();
    assert_eq!(
        routes,
        [
            ("192.168.50.0/24".to_owned(), "10.77.0.1".to_owned(), 0),
            ("10.99.0.0/16".to_owned(), String::new(), 253),
            ("0.0.0.0/0".to_owned(), "10.77.0.254".to_owned(), 0),
        ]
    );
    // The server committed the lease to our MAC (it saw a proper REQUEST, not just a DISCOVER).
    let mac = lab.cli_mac();
    let leases = dns.leases();
    assert!(
        leases.contains(&mac) && leases.contains(&lease.address.to_string()),
        "{leases}"
    );
    // The device is as it was: down again, and no address configured in its netns.
    assert!(!lab.cli_up(), "admin state restored to down");
    assert_eq!(lab.cli_v4_addrs().trim(), "");

    // Already up: stays up, and the server hands out the same address again.
    lab.cli.ip(&["link", "set", &lab.cli_if, "up"])?;
    let again = lab.client(Duration::from_secs(5)).lease(&lab.cli_if).await?;
    assert_eq!(again.address, lease.address);
    assert!(lab.cli_up(), "an up device stays up");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_is_a_timeout_and_the_device_goes_back_down() -> Result<()> {
    root_or_skip!("no_server_is_a_timeout_and_the_device_goes_back_down");
    let lab = Lab::new()?;
    let t0 = Instant::now();
    let err = lab
        .client(Duration::from_millis(1500))
        .lease(&lab.cli_if)
        .await
        .unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(
            err,
            DhcpError::Timeout {
                waiting_for: "DHCPOFFER",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("no DHCPOFFER within 1.5s"), "{err}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(!lab.cli_up(), "admin state restored after the timeout");
    // A missing interface is a clear error, nothing touched.
    let err = lab
        .client(Duration::from_millis(500))
        .lease("nosuchif0")
        .await
        .unwrap_err();
    assert!(matches!(err, DhcpError::NoSuchInterface(_)), "{err}");

    // Cancelled mid-exchange (Prepare dropped): the device still goes back down.
    let client = lab.client(Duration::from_secs(2));
    let cancelled = tokio::time::timeout(Duration::from_millis(300), client.lease(&lab.cli_if)).await;
    assert!(cancelled.is_err(), "the exchange cannot finish without a server");
    let deadline = Instant::now() + Duration::from_secs(2);
    while lab.cli_up() {
        assert!(Instant::now() < deadline, "still up after a cancelled exchange");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// What the scripted server answers to the REQUEST.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Nak,
    AckWithoutMask,
    AckWithBadRoutes,
    /// An ACK from another server id first (to be ignored), then the real one.
    ForeignAckThenAck,
}

/// A DHCP server scripted with dranet's own codec on a UDP socket in the server netns; it
/// also sends a reply with a wrong xid first, which the client must ignore.
struct Scripted {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Scripted {
    fn start(lab: &Lab, answer: Answer) -> Result<Self> {
        let ns = Netns::open_path(&lab.srv.path)?;
        let ifname = lab.srv_if.clone();
        let sock = dranet::sys::netns::in_netns(&ns, move || -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind("0.0.0.0:67")?;
            nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::BindToDevice,
                &std::ffi::OsString::from(ifname),
            )?;
            s.set_broadcast(true)?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            Ok(s)
        })??;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || serve(&sock, answer, &flag));
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    fn finish(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("scripted server panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn reply_to(req: &Message, kind: MessageType, yiaddr: Ipv4Addr, server: Ipv4Addr) -> Message {
    let mut m = req.clone();
    m.op = 2;
    m.yiaddr = yiaddr;
    m.options = vec![(opt::MESSAGE_TYPE, vec![kind.code()])];
    m.set_option(opt::SERVER_ID, server.octets().to_vec());
    m
}

fn serve(sock: &UdpSocket, answer: Answer, stop: &AtomicBool) -> Result<()> {
    let offered = Ipv4Addr::new(10, 77, 0, 99);
    let to = "255.255.255.255:68";
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let req = Message::decode(&buf[..n])?;
        match req.message_type() {
            Some(MessageType::Discover) => {
                let mut wrong = reply_to(&req, MessageType::Offer, Ipv4Addr::new(10, 77, 0, 98), SERVER_IP);
                wrong.xid = req.xid.wrapping_add(1);
                wrong.set_option(opt::SUBNET_MASK, vec![255, 255, 255, 0]);
                sock.send_to(&wrong.encode(), to)?;
                let mut offer = reply_to(&req, MessageType::Offer, offered, SERVER_IP);
                offer.set_option(opt::SUBNET_MASK, vec![255, 255, 255, 0]);
                sock.send_to(&offer.encode(), to)?;
            }
            Some(MessageType::Request) => {
                if req.ip_option(opt::REQUESTED_IP)? != Some(offered)
                    || req.ip_option(opt::SERVER_ID)? != Some(SERVER_IP)
                {
                    bail!("REQUEST does not name the offer: {req:?}");
                }
                let m = match answer {
                    Answer::Nak => {
                        let mut m = reply_to(&req, MessageType::Nak, Ipv4Addr::UNSPECIFIED, SERVER_IP);
                        m.set_option(opt::MESSAGE, b"address not available".to_vec());
                        m
                    }
                    Answer::AckWithoutMask => reply_to(&req, MessageType::Ack, offered, SERVER_IP),
                    Answer::AckWithBadRoutes => {
                        let mut m = reply_to(&req, MessageType::Ack, offered, SERVER_IP);
                        m.set_option(opt::SUBNET_MASK, vec![255, 255, 255, 0]);
                        m.set_option(opt::CLASSLESS_ROUTE, vec![24, 192, 168, 1, 10, 77]);
                        m
                    }
                    Answer::ForeignAckThenAck => {
                        let mut foreign = reply_to(
                            &req,
                            MessageType::Nak,
                            Ipv4Addr::UNSPECIFIED,
                            Ipv4Addr::new(10, 77, 0, 200),
                        );
                        foreign.set_option(opt::MESSAGE, b"not yours".to_vec());
                        sock.send_to(&foreign.encode(), to)?;
                        let mut m = reply_to(&req, MessageType::Ack, offered, SERVER_IP);
                        m.set_option(opt::SUBNET_MASK, vec![255, 255, 0, 0]);
                        m
                    }
                };
                sock.send_to(&m.encode(), to)?;
            }
            _ => {}
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nak_and_unusable_acks_are_clear_errors_and_restore_the_device() -> Result<()> {
    root_or_skip!("nak_and_unusable_acks_are_clear_errors_and_restore_the_device");
    for (answer, want) in [
        (
            Answer::Nak,
            "DHCPNAK from server 10.77.0.1: address not available",
        ),
        (
            Answer::AckWithoutMask,
            "unusable DHCPACK: no subnet mask (option 1)",
        ),
        (Answer::AckWithBadRoutes, "option 121: truncated router"),
        (Answer::ForeignAckThenAck, ""),
    ] {
        let lab = Lab::new()?;
        let server = Scripted::start(&lab, answer)?;
        let t0 = Instant::now();
        let got = lab.client(Duration::from_secs(5)).lease(&lab.cli_if).await;
        // An answer ends the exchange at once, not at the timeout.
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{answer:?}: {:?}",
            t0.elapsed()
        );
        match answer {
            Answer::ForeignAckThenAck => {
                let lease = got.with_context(|| format!("{answer:?}"))?;
                assert_eq!(lease.cidr(), "10.77.0.99/16");
            }
            _ => {
                let err = got.unwrap_err().to_string();
                assert!(err.contains(want), "{answer:?}: {err}");
            }
        }
        assert!(!lab.cli_up(), "{answer:?}: admin state restored");
        assert_eq!(lab.cli_v4_addrs().trim(), "", "{answer:?}");
        server.finish()?;
    }
    Ok(())
}

fn dhcp_claim(name: &str, uid: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": device}],
                "config": [{"source": "FromClaim", "opaque": {"driver": "dra.net",
                    "parameters": {"interface": {"name": "net1", "dhcp": true}}}}]
            }},
            "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": "pod-dhcp"}]
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_with_dhcp_puts_the_dnsmasq_lease_into_the_plan() -> Result<()> {
    if !require_root_and_dnsmasq("prepare_with_dhcp_puts_the_dnsmasq_lease_into_the_plan")? {
        return Ok(());
    }
    let lab = Lab::new()?;
    let dns = Dnsmasq::start(
        &lab,
        &["--dhcp-option=121,192.168.60.0/24,10.77.0.1,10.99.0.0/16,0.0.0.0"],
    )?;
    let claims = MemoryClaimSource::new();
    claims.insert(dhcp_claim("c", "uid-c", "nic0"));
    claims.insert(dhcp_claim("missing", "uid-m", "nic1"));
    let inventory = SharedInventory::new(vec![
        Device {
            name: "nic0".into(),
            ifname: Some(lab.cli_if.clone()),
            // Host addresses are not copied when the config asks for DHCP.
            addresses: vec!["192.0.2.5/24".into()],
            ..Device::default()
        },
        Device {
            name: "nic1".into(),
            ifname: Some("nosuchif1".into()),
            ..Device::default()
        },
    ]);
    let sink = Arc::new(RecordingSink::default());
    let p = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims),
        Arc::new(inventory),
        sink.clone(),
    )
    .with_leases(Arc::new(lab.client(Duration::from_secs(5))));
    let cref = |name: &str, uid: &str| ClaimRef {
        namespace: "default".into(),
        name: name.into(),
        uid: uid.into(),
    };
    p.prepare(&cref("c", "uid-c"))
        .await
        .with_context(|| format!("dnsmasq log:\n{}", dns.log()))?;
    let plans = sink.plans().clone();
    let cfg = &plans["pod-dhcp"].devices[0].config;
    assert_eq!(cfg.interface.name.as_deref(), Some("net1"));
    assert_eq!(cfg.interface.addresses.len(), 1, "{:?}", cfg.interface.addresses);
    let addr = &cfg.interface.addresses[0];
    assert!(addr.starts_with("10.77.0.") && addr.ends_with("/24"), "{addr}");
    assert!(dns.leases().contains(addr.trim_end_matches("/24")));
    assert_eq!(cfg.routes.len(), 2, "{:?}", cfg.routes);
    assert_eq!(cfg.routes[0].destination, "192.168.60.0/24");
    assert_eq!(cfg.routes[0].gateway, "10.77.0.1");
    assert_eq!(cfg.routes[1].destination, "10.99.0.0/16");
    assert_eq!((cfg.routes[1].gateway.as_str(), cfg.routes[1].scope), ("", 253));
    assert!(!lab.cli_up(), "device back down after Prepare");

    // The plan works in a pod: moved with the leased address and routes, the server answers.
    let pod = PodNetns::create(&unique("dhp"))?;
    let host_nl = dranet::sys::link::Netlink::in_netns(&Netns::open_path(&lab.cli.path)?).await?;
    let pod_ns = Netns::open_path(&pod.path)?;
    let pod_nl = dranet::sys::link::Netlink::in_netns(&pod_ns).await?;
    let snap = dranet::sys::link::snapshot(&host_nl, &lab.cli_if).await?;
    let spec = dranet::sys::link::AttachSpec::from_plan(&plans["pod-dhcp"].devices[0], "net1")?;
    let in_pod = PodIfindex::same_as(HostIfindex::new(snap.ifindex));
    dranet::sys::link::attach(&host_nl, &pod_nl, &pod_ns, &snap, &spec, in_pod).await?;
    let routes = pod.ip(&["-4", "route", "show", "dev", "net1"])?;
    let route = |dest: &str| routes.lines().find(|l| l.starts_with(dest)).unwrap_or("");
    assert!(route("192.168.60.0/24 ").contains("via 10.77.0.1"), "{routes}");
    let on_link = route("10.99.0.0/16 ");
    assert!(
        on_link.contains("scope link") && !on_link.contains("via"),
        "{routes}"
    );
    let pod_addr = pod.ip(&["-4", "-o", "addr", "show", "dev", "net1"])?;
    assert!(pod_addr.contains(addr.as_str()), "{pod_addr}");
    // The server answers the pod's ARP for it (one UDP datagram from the pod triggers it).
    let server_mac = {
        let out = lab.srv.ip(&["-o", "link", "show", &lab.srv_if])?;
        out.split("link/ether ").nth(1).unwrap()[..17].to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        sh(&[
            "ip",
            "netns",
            "exec",
            &pod.name,
            "bash",
            "-c",
            "echo x > /dev/udp/10.77.0.1/9",
        ])?;
        let neigh = pod.ip(&["neigh", "show", "10.77.0.1", "dev", "net1"])?;
        if neigh.contains(&format!("lladdr {server_mac}")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server not reachable from the pod: {neigh}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A DHCP failure is a per-claim prepare error; nothing is stored for it.
    let err = p.prepare(&cref("missing", "uid-m")).await.unwrap_err();
    let err = dranet::telemetry::chain(&err).to_string();
    assert!(
        err.contains("device nic1: failed to get configuration via DHCP for nosuchif1")
            && err.contains("not found"),
        "{err}"
    );
    assert_eq!(sink.plans()["pod-dhcp"].devices.len(), 1);
    drop(dns);
    assert!(Path::new(&lab.cli.path).exists());
    Ok(())
}
