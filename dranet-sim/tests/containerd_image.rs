//! dranet from its own image on a real containerd, deployed as `deploy/daemonset.yaml` says
//! (issue 35), as root.
//!
//! The image is the one `cargo xtask image` builds (`target/image/dranet-*.oci.tar`, made by
//! `cargo xtask test`; under `CI=true` a missing image or runtime fails the test): its base layer
//! and config as built, its binary layer replaced by the binary under test (the same path, the
//! same way `cargo xtask image` packs it), imported under the manifest's `image:` reference. The
//! DaemonSet's pod is run over CRI as kubelet runs it, everything read from the manifest (parsed
//! here, so a change of the manifest changes the test): host network and host PID (NamespaceMode
//! NODE), the privileged security context on sandbox and container, the container's args with
//! `$(NODE_NAME)` expanded from its env (`fieldRef spec.nodeName`), its env, every volumeMount
//! with its hostPath and mount propagation, the readiness probe's path, the termination grace
//! period.
//!
//! What the test changes, because the node is a test node on a shared machine:
//! - the hostPaths of kubelet's plugin dirs, the NRI socket dir and the state dir point at this
//!   node's own directories (the kubelet simulator and the fixture's containerd live there; the
//!   state dir is made a shared mount, as a node's /run is); the others are the machine's own,
//!   bind-mounted into a shared mount of the node where the machine's mount is private (containerd
//!   requires a shared or slave source for HostToContainer and Bidirectional; a systemd host has
//!   `/` shared), and a missing `DirectoryOrCreate` path is created in the node's dir instead;
//! - containerd's pod netns go where a node's do (`/var/run/netns`), not under its state dir;
//! - the port of `--bind-address` is a free one (two nodes share the host network);
//! - added args: `--claims-dir` and `--slices-dir` (no API server: claims from files, mounted at
//!   the same path) and `--filter=` (veth pairs stand in for NICs; the default filter hides veth).
//!
//! Then: (a) the daemon in the container becomes ready (`/readyz` on the host network) and
//! registers with kubelet; (b) a pod with a dranet claim gets its NIC, and the pin appears on the
//! host as a mount under the state dir (Bidirectional propagation works); (c) the dranet pod
//! stopped and removed (StopContainer with the grace period, StopPodSandbox, RemoveContainer,
//! RemovePodSandbox), the tenant's device stays in its pod and its pin on the host; (d) a new
//! dranet pod brings the device home restored (name, MTU, MAC, addresses, up) at the tenant's
//! teardown, and no pin is left.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use dranet_sim::containerd::{self, Containerd, Runtime, SANDBOX_IMAGE};
use dranet_sim::cri::{Cri, PodIdentity, pb};
use dranet_sim::fixtures::{nic_device, wait_for};
use dranet_sim::kernel::{dranet_bin, host_has, unique};
use dranet_sim::kubelet::{KubeletSim, RegisteredPlugin};
use dranet_sim::nic::{Nic, wait_restored};
use dranet_sim::oci;
use dranet_sim::real_node::{CriPod, ip_in, netns_has};
use dranet_sim::root_tests;
use serde_json::{Value, json};

const HOME_WITHIN: Duration = Duration::from_secs(10);
const READY_WITHIN: Duration = Duration::from_secs(60);
const NODE_NAME: &str = "sim-node";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One volumeMount of the container with its volume's hostPath.
#[derive(Debug, Clone)]
struct MountSpec {
    name: String,
    mount_path: String,
    propagation: String,
    read_only: bool,
    host_path: String,
    host_type: String,
}

/// What `deploy/daemonset.yaml` says about the dranet pod.
#[derive(Debug)]
struct Deployed {
    image: String,
    container: String,
    namespace: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    privileged: bool,
    host_network: bool,
    host_pid: bool,
    grace: i64,
    mounts: Vec<MountSpec>,
    readiness_path: String,
}

fn deployed() -> Result<Deployed> {
    let text = std::fs::read_to_string(repo().join("deploy/daemonset.yaml"))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).context("parsing deploy/daemonset.yaml")?;
    let ds = docs
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .context("no DaemonSet in deploy/daemonset.yaml")?;
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut env = Vec::new();
    for e in c["env"].as_array().cloned().unwrap_or_default() {
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName" {
            NODE_NAME.to_owned()
        } else {
            bail!(
                "env {} comes from a source this test does not know: {e}",
                e["name"]
            );
        };
        env.push((s(&e["name"]), value));
    }
    // kubelet expands $(VAR) in args from the container's env.
    let args = c["args"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            env.iter()
                .fold(s(a), |acc, (k, v)| acc.replace(&format!("$({k})"), v))
        })
        .collect();
    let volumes: HashMap<String, Value> = spec["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|v| (s(&v["name"]), v))
        .collect();
    let mut mounts = Vec::new();
    for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
        let name = s(&m["name"]);
        let vol = volumes.get(&name).with_context(|| format!("no volume {name}"))?;
        ensure!(
            vol["hostPath"].is_object(),
            "volume {name} is not a hostPath: {vol}"
        );
        mounts.push(MountSpec {
            name,
            mount_path: s(&m["mountPath"]),
            propagation: s(&m["mountPropagation"]),
            read_only: m["readOnly"].as_bool().unwrap_or(false),
            host_path: s(&vol["hostPath"]["path"]),
            host_type: s(&vol["hostPath"]["type"]),
        });
    }
    Ok(Deployed {
        image: s(&c["image"]),
        container: s(&c["name"]),
        namespace: s(&ds["metadata"]["namespace"]),
        args,
        env,
        privileged: c["securityContext"]["privileged"].as_bool().unwrap_or(false),
        host_network: spec["hostNetwork"].as_bool().unwrap_or(false),
        host_pid: spec["hostPID"].as_bool().unwrap_or(false),
        grace: spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30),
        mounts,
        readiness_path: s(&c["readinessProbe"]["httpGet"]["path"]),
    })
}

impl Deployed {
    /// The value of `--<flag>=` in the manifest's args.
    fn arg(&self, flag: &str) -> Option<&str> {
        self.args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--{flag}=")))
    }
}

/// The dranet image `cargo xtask image` left under `target/image/` (the newest), or `None`
/// (skipped, and said so) outside CI.
fn built_image(test: &str) -> Result<Option<PathBuf>> {
    let dir = containerd::runtimes_dir()
        .parent()
        .map(|t| t.join("image"))
        .context("target dir")?;
    let newest = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("dranet-") && n.ends_with(".oci.tar"))
                })
                .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        })
        .ok()
        .flatten();
    match newest {
        Some(p) => Ok(Some(p)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => bail!(
            "{test}: no dranet image under {} (run `cargo xtask image`, which `cargo xtask test` does) (CI=true: refusing to skip)",
            dir.display()
        ),
        None => {
            eprintln!(
                "skipping {test}: no dranet image under {} (run `cargo xtask image --dev`)",
                dir.display()
            );
            Ok(None)
        }
    }
}

/// The image as built, its binary layer replaced by the binary under test, under `reference`.
fn image_under_test(built: &Path, reference: &str) -> Result<(Vec<u8>, Value)> {
    let img = oci::read_archive(&std::fs::read(built)?)?;
    ensure!(
        img.layers.len() == 2,
        "the image has {} layers, not base + binary",
        img.layers.len()
    );
    let entry = img.config["Entrypoint"][0]
        .as_str()
        .context("the image has no entrypoint")?
        .trim_start_matches('/')
        .to_owned();
    let mut tree = oci::Tree::default();
    tree.file(&entry, 0o755, std::fs::read(dranet_bin()?)?);
    let top = oci::Layer::from_tar(&tree.to_tar()?, "the dranet binary under test");
    let archive = oci::image_archive(&oci::ImageSpec {
        reference,
        layers: vec![img.layers[0].clone(), top],
        config: img.config.clone(),
    })?;
    Ok((archive.bytes, img.config))
}

/// Mount points under `dir` in this process's mount namespace (the host's).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect()
}

/// Whether the mount holding `path` propagates (shared or slave), per `/proc/self/mountinfo`.
fn propagates(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = Path::new(f.get(4)?);
            let opt_end = f.iter().position(|x| *x == "-")?;
            path.starts_with(point).then(|| {
                (
                    point.components().count(),
                    f[6..opt_end]
                        .iter()
                        .any(|o| o.starts_with("shared:") || o.starts_with("master:")),
                )
            })
        })
        .max_by_key(|(depth, _)| *depth)
        .is_some_and(|(_, p)| p)
}

fn bind_shared(src: &Path, at: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(at)?;
    mount(
        Some(src),
        at,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .with_context(|| format!("bind {} on {}", src.display(), at.display()))?;
    mount(
        None::<&str>,
        at,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .with_context(|| format!("make {} shared", at.display()))?;
    Ok(())
}

/// A node whose dranet runs from its image in the fixture's containerd.
struct ImageNode {
    dir: PathBuf,
    d: Deployed,
    kubelet: KubeletSim,
    plugin: Option<RegisteredPlugin>,
    cri: Cri,
    port: u16,
    /// The dranet pod's sandbox and container and its config.
    dranet: Option<(String, String, pb::PodSandboxConfig)>,
    /// Pod netns paths under /var/run/netns to remove if a failure leaves them.
    netns: Vec<String>,
    /// The host source of each volume, made once (a bind mount is never stacked).
    sources: HashMap<String, String>,
    ctrd: Containerd,
}

impl ImageNode {
    async fn start(rt: &Runtime, built: &Path) -> Result<Self> {
        let d = deployed()?;
        let mut ctrd = Containerd::start(rt).await?;
        // A node's containerd puts pod netns under /var/run/netns, where the manifest's
        // netns volumes look.
        let conf = std::fs::read_to_string(ctrd.layout.config())?;
        ensure!(
            conf.contains("netns_mounts_under_state_dir = true"),
            "fixture config changed:\n{conf}"
        );
        std::fs::write(
            ctrd.layout.config(),
            conf.replace(
                "netns_mounts_under_state_dir = true",
                "netns_mounts_under_state_dir = false",
            ),
        )?;
        ctrd.restart().await?;
        std::fs::create_dir_all("/run/netns")?;
        let dir = std::env::temp_dir().join(unique("dranet-img-"));
        for sub in [
            "claims",
            "slices",
            "state",
            "kubelet/plugins",
            "kubelet/plugins_registry",
            "logs",
        ] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let mut kubelet = KubeletSim::new(dir.join("kubelet"));
        kubelet.plugin_root = Some(PathBuf::from(
            d.arg("kubelet-root-dir")
                .context("no --kubelet-root-dir in the manifest")?,
        ));
        // Images: the pause image made here and dranet's.
        let images = containerd::runtimes_dir().join("images");
        let pause = oci::build_pause(&images)?;
        std::fs::write(
            dir.join("pause.oci.tar"),
            oci::pause_archive(&pause, SANDBOX_IMAGE)?,
        )?;
        let t = Instant::now();
        let (archive, config) = image_under_test(built, &d.image)?;
        std::fs::write(dir.join("dranet.oci.tar"), archive)?;
        let packed = t.elapsed();
        for a in ["pause.oci.tar", "dranet.oci.tar"] {
            let p = dir.join(a).display().to_string();
            ctrd.ctr(&["-n", "k8s.io", "images", "import", &p])
                .with_context(|| format!("importing {a}"))?;
        }
        println!(
            "image {} (from {}, repacked in {packed:?}, imported in {:?}): entrypoint {}, cmd {}, labels {}",
            d.image,
            built.display(),
            t.elapsed() - packed,
            config["Entrypoint"],
            config["Cmd"],
            config["Labels"]
        );
        let cri = Cri::connect(
            &ctrd.layout.address(),
            dir.join("logs"),
            ctrd.layout.cgroup_parent(),
        )
        .await?;
        let t = Instant::now();
        while !(cri.has_image(SANDBOX_IMAGE).await? && cri.has_image(&d.image).await?) {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("CRI never saw the imported images: {:?}", cri.image_tags().await?);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let node = Self {
            dir,
            d,
            kubelet,
            plugin: None,
            cri,
            port,
            dranet: None,
            netns: Vec::new(),
            sources: HashMap::new(),
            ctrd,
        };
        // State dir: a shared mount, as a node's /run is (Bidirectional needs it).
        bind_shared(&node.state_dir(), &node.state_dir())?;
        Ok(node)
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The host source of a manifest volume on this node.
    fn host_source(&self, m: &MountSpec) -> Result<String> {
        let kubelet_root = self.d.arg("kubelet-root-dir").unwrap_or("/var/lib/kubelet");
        let nri_dir = self
            .d
            .arg("nri-socket")
            .and_then(|s| Path::new(s).parent())
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let state = self.d.arg("state-dir").unwrap_or("/run/dranet");
        let own = if let Some(rel) = m.host_path.strip_prefix(&format!("{kubelet_root}/")) {
            Some(self.dir.join("kubelet").join(rel))
        } else if m.host_path == nri_dir {
            Some(self.ctrd.layout.dir.join("nri"))
        } else if m.host_path == state {
            Some(self.state_dir())
        } else {
            None
        };
        if let Some(p) = own {
            return Ok(p.display().to_string());
        }
        let host = Path::new(&m.host_path);
        let needs_propagation = !m.propagation.is_empty() && m.propagation != "None";
        if !host.exists() {
            ensure!(
                m.host_type == "DirectoryOrCreate",
                "hostPath {} (type {:?}) is missing on this machine",
                m.host_path,
                m.host_type
            );
            let p = self.dir.join("host").join(m.host_path.trim_start_matches('/'));
            std::fs::create_dir_all(&p)?;
            if needs_propagation && !propagates(&p) {
                bind_shared(&p, &p)?;
            }
            return Ok(p.display().to_string());
        }
        let real = host.canonicalize()?;
        if needs_propagation && !propagates(&real) {
            let p = self.dir.join("host").join(m.host_path.trim_start_matches('/'));
            bind_shared(&real, &p)?;
            return Ok(p.display().to_string());
        }
        Ok(real.display().to_string())
    }

    /// RunPodSandbox + CreateContainer + StartContainer of the DaemonSet's pod, as kubelet.
    async fn run_dranet(&mut self) -> Result<Duration> {
        let uid = unique("ds-");
        let ident = PodIdentity {
            name: format!("dranet-{uid}"),
            namespace: self.d.namespace.clone(),
            uid: uid.clone(),
            attempt: 0,
        };
        let node_ns = |host: bool| {
            if host {
                pb::NamespaceMode::Node
            } else {
                pb::NamespaceMode::Pod
            }
        };
        let ns = pb::NamespaceOption {
            network: node_ns(self.d.host_network).into(),
            pid: if self.d.host_pid {
                pb::NamespaceMode::Node
            } else {
                pb::NamespaceMode::Container
            }
            .into(),
            ipc: pb::NamespaceMode::Pod.into(),
            target_id: String::new(),
        };
        let mut sandbox = self.cri.sandbox_config(&ident);
        if self.d.host_network {
            // kubelet sets a hostname only for pods with their own network (and UTS) namespace.
            sandbox.hostname = String::new();
        }
        if let Some(l) = sandbox.linux.as_mut() {
            l.security_context = Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(ns.clone()),
                // kubelet marks the sandbox privileged when a container is.
                privileged: self.d.privileged,
                ..Default::default()
            });
        }
        let mut mounts = Vec::new();
        for m in &self.d.mounts.clone() {
            let host_path = match self.sources.get(&m.name) {
                Some(p) => p.clone(),
                None => {
                    let p = self
                        .host_source(m)
                        .with_context(|| format!("volume {}", m.name))?;
                    self.sources.insert(m.name.clone(), p.clone());
                    p
                }
            };
            mounts.push(pb::Mount {
                container_path: m.mount_path.clone(),
                host_path,
                readonly: m.read_only,
                selinux_relabel: false,
                propagation: match m.propagation.as_str() {
                    "Bidirectional" => pb::MountPropagation::PropagationBidirectional,
                    "HostToContainer" => pb::MountPropagation::PropagationHostToContainer,
                    _ => pb::MountPropagation::PropagationPrivate,
                }
                .into(),
            });
        }
        // No API server: claims and slices from files, mounted where the daemon reads them.
        for sub in ["claims", "slices"] {
            let p = self.dir.join(sub).display().to_string();
            mounts.push(pb::Mount {
                container_path: p.clone(),
                host_path: p,
                ..Default::default()
            });
        }
        let mut args: Vec<String> = self
            .d
            .args
            .iter()
            .map(|a| {
                if a.starts_with("--bind-address=") {
                    format!("--bind-address=:{}", self.port)
                } else {
                    a.clone()
                }
            })
            .collect();
        args.extend([
            format!("--claims-dir={}", self.dir.join("claims").display()),
            format!("--slices-dir={}", self.dir.join("slices").display()),
            "--filter=".to_owned(),
        ]);
        let mut labels = HashMap::from([
            ("io.kubernetes.pod.name".to_owned(), ident.name.clone()),
            ("io.kubernetes.pod.namespace".to_owned(), ident.namespace.clone()),
            ("io.kubernetes.pod.uid".to_owned(), ident.uid.clone()),
        ]);
        labels.insert("io.kubernetes.container.name".into(), self.d.container.clone());
        let config = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: self.d.container.clone(),
                attempt: 0,
            }),
            image: Some(pb::ImageSpec {
                image: self.d.image.clone(),
                user_specified_image: self.d.image.clone(),
                ..Default::default()
            }),
            args,
            envs: self
                .d
                .env
                .iter()
                .map(|(k, v)| pb::KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            mounts,
            labels,
            log_path: format!("{}/0.log", self.d.container),
            linux: Some(pb::LinuxContainerConfig {
                security_context: Some(pb::LinuxContainerSecurityContext {
                    privileged: self.d.privileged,
                    namespace_options: Some(ns),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let t = Instant::now();
        let sid = self.cri.run_pod_sandbox_config(sandbox.clone()).await?;
        let cid = self
            .cri
            .create_and_start_config(&sid, config, sandbox.clone())
            .await
            .with_context(|| {
                format!(
                    "the dranet container; containerd log:\n{}",
                    tail(&self.ctrd.log_text(), 30)
                )
            })?;
        self.dranet = Some((sid, cid, sandbox));
        // kubelet's plugin watcher registers it; /readyz waits for that and for NRI.
        let plugin = self
            .kubelet
            .register_when_ready(READY_WITHIN)
            .await
            .with_context(|| {
                format!(
                    "the dranet container never registered; its log:\n{}",
                    self.dranet_log()
                )
            })?;
        self.plugin = Some(plugin);
        self.wait_ready().await?;
        Ok(t.elapsed())
    }

    /// The dranet container's log (CRI format).
    fn dranet_log(&self) -> String {
        self.dranet
            .as_ref()
            .map(|(_, _, s)| Path::new(&s.log_directory).join(&self.d.container).join("0.log"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// `GET <readiness path>` on the host network.
    fn readyz(&self) -> Option<(u16, String)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(
            s,
            "GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n",
            self.d.readiness_path
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, out))
    }

    async fn wait_ready(&self) -> Result<()> {
        let t = Instant::now();
        loop {
            if let Some((200, _)) = self.readyz() {
                return Ok(());
            }
            if t.elapsed() > READY_WITHIN {
                bail!(
                    "the dranet container was not ready within {READY_WITHIN:?} (last: {:?}); its log:\n{}",
                    self.readyz().map(|(_, b)| b),
                    self.dranet_log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// kubelet's kill of the dranet pod (StopContainer with the grace period, StopPodSandbox),
    /// then the garbage collector's RemoveContainer and RemovePodSandbox.
    async fn remove_dranet(&mut self) -> Result<String> {
        let (sid, cid, _) = self.dranet.clone().context("no dranet pod")?;
        let log = self.dranet_log();
        self.plugin = None;
        self.cri.stop_container(&cid, self.d.grace).await?;
        self.cri.stop_pod_sandbox(&sid).await?;
        self.cri.remove_container(&cid).await?;
        self.cri.remove_pod_sandbox(&sid).await?;
        self.dranet = None;
        Ok(log)
    }

    async fn prepare(&self, pod: &CriPod, devices: &[(String, Value)]) -> Result<()> {
        let obj = dranet_sim::node::claim_object(&pod.claim, &pod.ident.uid, devices);
        let dir = self.dir.join("claims").join(&pod.claim.namespace);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join(format!("{}.json", pod.claim.name)),
            serde_json::to_vec_pretty(&obj)?,
        )?;
        let plugin = self.plugin.as_ref().context("dranet not registered")?;
        let r = plugin.prepare(std::slice::from_ref(&pod.claim)).await?;
        let res = r.get(&pod.claim.uid).context("no result for the claim")?;
        ensure!(res.error.is_empty(), "prepare: {}", res.error);
        Ok(())
    }

    async fn unprepare(&self, pod: &CriPod) -> Result<()> {
        let plugin = self.plugin.as_ref().context("dranet not registered")?;
        let r = plugin.unprepare(std::slice::from_ref(&pod.claim)).await?;
        if let Some(e) = r.get(&pod.claim.uid).filter(|e| !e.is_empty()) {
            bail!("unprepare: {e}");
        }
        Ok(())
    }

    /// The pins on the host: mounts under `<state dir>/pins` in the host's mount namespace.
    fn host_pins(&self) -> Vec<PathBuf> {
        mounts_under(&self.state_dir().join("pins"))
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for ImageNode {
    fn drop(&mut self) {
        use nix::mount::{MntFlags, umount2};
        // Failure paths only: pods containerd did not remove leave their netns mounts.
        for ns in &self.netns {
            if Path::new(ns).exists() {
                let _ = umount2(Path::new(ns), MntFlags::MNT_DETACH);
                let _ = std::fs::remove_file(ns);
            }
        }
        // Every mount under the node's dir, deepest first, as many times as it is stacked; the
        // state dir is one itself.
        let mut points = mounts_under(&self.dir);
        points.push(self.dir.join("state"));
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = umount2(&p, MntFlags::MNT_DETACH);
        }
        let left = mounts_under(&self.dir);
        if !left.is_empty() {
            // Never delete through a mount (the host's bpffs is bound here).
            eprintln!(
                "mounts left under {}: {left:?}; not removing it",
                self.dir.display()
            );
        } else if std::env::var_os("DRANET_KEEP_CONTAINERD").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        // Then the fields: the containerd fixture kills what it started.
    }
}

async fn deployed_image(test: &str, suite: &str) -> Result<()> {
    let Some(rt) = containerd::require(test, suite)? else {
        return Ok(());
    };
    let Some(built) = built_image(test)? else {
        return Ok(());
    };
    let (nics, before) = Nic::many_with_views(1)?;
    let t = Instant::now();
    dranet_bin()?;
    println!("binary under test ready in {:?}", t.elapsed());
    let t = Instant::now();
    let mut node = ImageNode::start(&rt, &built).await?;
    println!("node up in {:?}", t.elapsed());
    ensure!(
        node.d.host_network && node.d.host_pid && node.d.privileged,
        "{:?}",
        node.d
    );
    // (a) ready and registered.
    let first = node.run_dranet().await?;
    println!(
        "containerd {}: dranet container ready (/readyz 200) {first:?} after RunPodSandbox",
        rt.upstream()
    );
    // (b) a pod with a dranet claim gets its NIC; the pin is on the host.
    let mut pod = CriPod::new("img-");
    let device = nic_device(
        &nics[0],
        json!({"interface": {"name": "net0", "addresses": ["192.168.90.2/24"]}}),
    );
    node.prepare(&pod, std::slice::from_ref(&device)).await?;
    let t = Instant::now();
    pod.run(&node.cri).await?;
    let ran = t.elapsed();
    let ns = pod.netns(&node.cri).await?;
    node.netns.push(ns.clone());
    ensure!(
        ns.starts_with("/var/run/netns/") || ns.starts_with("/run/netns/"),
        "netns at {ns}"
    );
    ensure!(
        !host_has(&nics[0].name),
        "{} still in the host; dranet log:\n{}",
        nics[0].name,
        node.dranet_log()
    );
    let addr = ip_in(&ns, &["-j", "addr", "show", "dev", "net0"])?;
    ensure!(addr.contains("192.168.90.2"), "net0 in the pod: {addr}");
    wait_for("the pin mounted on the host", Duration::from_secs(5), || {
        !node.host_pins().is_empty()
    })
    .await?;
    let pins = node.host_pins();
    println!(
        "containerd {}: pod with its NIC in {ran:?}; pin on the host: {pins:?}",
        rt.upstream()
    );
    // (c) the dranet pod gone: the device stays in the pod, the pin on the host.
    let t = Instant::now();
    let log = node.remove_dranet().await?;
    let removed = t.elapsed();
    ensure!(
        log.contains("dranet starting") || log.contains("\"dranet starting\""),
        "the container's log does not show the daemon:\n{log}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        netns_has(&ns, "net0"),
        "net0 left the pod when the dranet pod was removed"
    );
    ensure!(
        !host_has(&nics[0].name),
        "{} came home when the dranet pod was removed",
        nics[0].name
    );
    ensure!(
        node.host_pins() == pins,
        "pins on the host after the dranet pod went: {:?}, before {pins:?}",
        node.host_pins()
    );
    ensure!(
        node.readyz().is_none(),
        "something still answers on the dranet port"
    );
    println!(
        "containerd {}: dranet pod stopped and removed in {removed:?}; device and pin stay",
        rt.upstream()
    );
    // (d) a new dranet pod brings the device home at the pod's teardown.
    let second = node.run_dranet().await?;
    ensure!(
        netns_has(&ns, "net0"),
        "net0 left the pod when the new dranet started"
    );
    let t = Instant::now();
    pod.stop(&node.cri).await?;
    wait_restored(&nics[0].name, &before[0], HOME_WITHIN)
        .await
        .with_context(|| format!("not home; new dranet's log:\n{}", node.dranet_log()))?;
    let home = t.elapsed();
    wait_for("no pin on the host", Duration::from_secs(5), || {
        node.host_pins().is_empty()
    })
    .await?;
    pod.remove(&node.cri).await?;
    node.unprepare(&pod).await?;
    ensure!(
        !Path::new(&ns).exists(),
        "the pod netns {ns} outlived RemovePodSandbox"
    );
    println!(
        "containerd {}: new dranet container ready in {second:?}; StopPodSandbox to home restored {home:?}",
        rt.upstream()
    );
    node.remove_dranet().await?;
    Ok(())
}

/// `cargo xtask demo --runtime containerd`'s program: one pod life cycle on the real containerd
/// 2.x with `dranet trace`, ending in PASS (each device in the pod, then home restored, no pin).
async fn demo_on_the_real_runtime(test: &str) -> Result<()> {
    if containerd::require(test, "sid")?.is_none() {
        return Ok(());
    }
    // The demo runs the daemon next to itself (target/<profile>/dranet): build it.
    dranet_bin()?;
    let t = Instant::now();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_dranet-demo"))
        .args(["--runtime", "containerd", "--devices", "2"])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    ensure!(
        out.status.success() && stdout.contains("PASS:"),
        "the demo failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(stdout.contains("net1: in the pod"), "{stdout}");
    println!("demo on containerd: {:?}", t.elapsed());
    Ok(())
}

root_tests! {
    containerd_2_demo_on_the_real_runtime_passes =>
        demo_on_the_real_runtime("containerd_2_demo_on_the_real_runtime_passes");
    containerd_2_dranet_from_its_image_as_the_daemonset_keeps_and_returns_devices =>
        deployed_image("containerd_2_dranet_from_its_image_as_the_daemonset_keeps_and_returns_devices", "sid");
    containerd_1_7_dranet_from_its_image_as_the_daemonset_keeps_and_returns_devices =>
        deployed_image("containerd_1_7_dranet_from_its_image_as_the_daemonset_keeps_and_returns_devices", "trixie");
}
