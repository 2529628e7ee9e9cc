//! The demo behind `cargo xtask demo`: one pod life cycle around the real `dranet run`, watched by
//! `dranet trace`, then a verdict from independent `ip -j` reads. `--runtime crio` and
//! `--runtime containerd-sim`: a simulated node (kubelet and runtime played by dranet-sim) in that
//! runtime's teardown order; `--runtime containerd`: Debian's containerd 2.x (from `cargo xtask
//! runtimes`) driven over CRI as kubelet drives it, with the kubelet simulator on DRA.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use dranet_sim::containerd;
use dranet_sim::kernel::{PodNetns, dranet_bin, host_has, unique};
use dranet_sim::kubelet::Claim;
use dranet_sim::nic::{Nic, view};
use dranet_sim::node::{Node, NodeOptions, sandbox};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use dranet_sim::real_node::{CriPod, RealNode, netns_has};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Runtime {
    Crio,
    /// The real containerd (Debian sid's 2.x).
    Containerd,
    /// The simulated runtime in containerd's order.
    ContainerdSim,
}

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum, default_value = "crio")]
    runtime: Runtime,
    #[arg(long, default_value_t = 2)]
    devices: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let nics: Vec<Nic> = (0..args.devices.max(1))
        .map(|_| Nic::create())
        .collect::<Result<_>>()?;
    let before: Vec<Value> = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
    if args.runtime == Runtime::Containerd {
        return real_containerd(&nics, &before).await;
    }
    let flavor = if args.runtime == Runtime::Crio {
        Flavor::Crio
    } else {
        Flavor::Containerd
    };
    let mut node = Node::start(NodeOptions {
        runtime: RuntimeConfig {
            flavor,
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    })
    .await?;
    println!(
        "== node: dranet run (pid state dir {}), kubelet and runtime simulated",
        node.state_dir().display()
    );
    let (mut trace, reader) = start_trace(&node.state_dir())?;

    let uid = unique("demo-pod-");
    let mut ns = PodNetns::create(&unique("dranet-demo-"))?;
    let claim = Claim::new("default", &format!("claim-{uid}"), &format!("claim-uid-{uid}"));
    let devices: Vec<(String, Value)> = nics
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                dranet::inventory::netdev_device_name(&n.name),
                json!({"interface": {"name": format!("net{i}")}}),
            )
        })
        .collect();
    node.write_claim(&claim, &uid, &devices)?;
    node.prepare(&claim).await?;
    let pod = sandbox(&uid, &ns.path);
    node.runtime.run_pod_sandbox(&pod).await?;
    node.runtime.set_state(vec![pod.clone()], vec![]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // What an API server would have got (embedded mode writes the apply body to a file).
    match node.claim_status(&claim, Duration::from_secs(2)).await {
        Ok(st) => println!(
            "== claim status ({}):\n{}",
            node.claim_status_path(&claim).display(),
            serde_json::to_string_pretty(&st["status"])?
        ),
        Err(e) => println!("== claim status: {e}"),
    }
    match args.runtime {
        Runtime::Crio => {
            // CRI-O: the netns goes first; StopPodSandbox comes 50 ms later.
            ns.remove_crio_style()?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            node.runtime.stop_pod_sandbox(&pod).await?;
            node.runtime.remove_pod_sandbox(&pod).await?;
        }
        Runtime::Containerd | Runtime::ContainerdSim => {
            node.runtime.stop_pod_sandbox(&pod).await?;
            ns.remove_crio_style()?;
            node.runtime.remove_pod_sandbox(&pod).await?;
        }
    }
    node.runtime.set_state(vec![], vec![]);
    node.unprepare(&claim).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_trace(&mut trace, reader)?;
    let order = match args.runtime {
        Runtime::Crio => "crio",
        _ => "containerd",
    };
    let mut ok = verdict(&format!("{order} order"), &nics, &before);
    let pins = node.pins();
    ok &= pins.is_empty();
    node.stop()?;
    if ok {
        println!("PASS: every device back home with its name, MTU, MAC, addresses and state; no pin left");
        Ok(())
    } else {
        bail!("FAIL: see above (pins left: {pins:?})")
    }
}

/// `dranet trace` on the daemon's event socket, its header printed; the rest is read by a thread.
fn start_trace(
    state_dir: &std::path::Path,
) -> Result<(std::process::Child, std::thread::JoinHandle<String>)> {
    let mut trace = Command::new(dranet_bin()?)
        .args(["trace", "--daemon-socket"])
        .arg(state_dir.join("events.sock"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(trace.stdout.take().context("trace stdout")?);
    let mut header = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line)? == 0 {
            bail!("dranet trace ended early:\n{header}");
        }
        header.push_str(&line);
        if line.contains("t(µs)") {
            break;
        }
    }
    print!("{header}");
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
        rest
    });
    Ok((trace, reader))
}

fn stop_trace(trace: &mut std::process::Child, reader: std::thread::JoinHandle<String>) -> Result<()> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(trace.id())?),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let _ = trace.wait();
    print!("{}", reader.join().unwrap_or_default());
    Ok(())
}

/// The verdict, from independent reads of the kernel (iproute2, not dranet's netlink code).
fn verdict(what: &str, nics: &[Nic], before: &[Value]) -> bool {
    println!("== verdict ({what}, {} device(s))", nics.len());
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut ok = true;
    for (n, b) in nics.iter().zip(before) {
        let mut now = view(&n.name, None).ok();
        while now.as_ref() != Some(b) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            now = view(&n.name, None).ok();
        }
        let same = now.as_ref() == Some(b);
        ok &= same;
        println!(
            "  {:<12} {}  name={} mtu={} mac={} up={}",
            n.name,
            if same && host_has(&n.name) {
                "home, restored"
            } else {
                "NOT RESTORED"
            },
            b["ifname"].as_str().unwrap_or("?"),
            b["mtu"],
            b["address"].as_str().unwrap_or("?"),
            b["up"]
        );
        if !same {
            println!(
                "    before: {b}\n    after:  {}",
                now.map_or_else(|| "missing".to_owned(), |v| v.to_string())
            );
        }
    }
    ok
}

/// One pod life cycle on Debian's containerd 2.x: kubelet's order over CRI (DRA Prepare,
/// RunPodSandbox, CreateContainer/StartContainer, StopContainer, StopPodSandbox,
/// RemoveContainer, RemovePodSandbox, Unprepare), the devices checked in the pod's netns.
async fn real_containerd(nics: &[Nic], before: &[Value]) -> Result<()> {
    let base = containerd::runtimes_dir();
    let rt = containerd::find(&base, "sid").context("`cargo xtask runtimes` fetches it")?;
    let node = RealNode::start(&rt).await?;
    println!(
        "== node: containerd {} (Debian sid, {}) with its own sockets and NRI, dranet run (state dir {}), kubelet simulated, CRI as kubelet",
        rt.upstream(),
        rt.version,
        node.state_dir().display()
    );
    let cri = node.cri().await?;
    let (mut trace, reader) = start_trace(&node.state_dir())?;
    let mut pod = CriPod::new("demo-");
    let devices: Vec<(String, Value)> = nics
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                dranet::inventory::netdev_device_name(&n.name),
                json!({"interface": {"name": format!("net{i}")}}),
            )
        })
        .collect();
    pod.prepare(&node, &devices).await?;
    let t = Instant::now();
    pod.run(&cri).await?;
    let ran = t.elapsed();
    let ns = pod.netns(&cri).await?;
    println!("== pod {} running ({ran:?}); in its netns {ns}:", pod.ident.name);
    let mut ok = true;
    for i in 0..nics.len() {
        let there = netns_has(&ns, &format!("net{i}"));
        ok &= there;
        println!("  net{i}: {}", if there { "in the pod" } else { "MISSING" });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    if let Ok(st) = std::fs::read_to_string(node.claim_status_path(&pod.claim)) {
        println!(
            "== claim status ({}):\n{st}",
            node.claim_status_path(&pod.claim).display()
        );
    }
    let t = Instant::now();
    pod.stop(&cri).await?;
    pod.remove(&cri).await?;
    println!(
        "== StopPodSandbox + RemovePodSandbox returned in {:?}",
        t.elapsed()
    );
    node.unprepare(&pod.claim).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_trace(&mut trace, reader)?;
    ok &= verdict(&format!("containerd {}", rt.upstream()), nics, before);
    let pins = node.pins();
    ok &= pins.is_empty();
    drop(cri);
    drop(node);
    if ok {
        println!(
            "PASS: every device in the pod, then back home with its name, MTU, MAC, addresses and state; no pin left"
        );
        Ok(())
    } else {
        bail!("FAIL: see above (pins left: {pins:?})")
    }
}
