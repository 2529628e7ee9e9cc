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
//!
//! And a DaemonSet rolling update (issue 36) from the manifest's image to another (same base and
//! binary, another revision label and digest), tenant pods run and stopped throughout: see
//! [`rolling_update`].

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
use dranet_sim::real_node::{
    CriPod, HOME_WITHIN, device_config, ip_in, netns_has, nri_answers, nri_unanswered, slowest_hook,
};
use dranet_sim::root_tests;
use serde_json::{Value, json};

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

/// The image as built, its binary layer replaced by the binary under test, under `reference`,
/// with its `org.opencontainers.image.revision` label set to `revision` if given (another image
/// of the same binary: another config, another digest). The archive, the config, the manifest
/// digest.
fn image_under_test(
    built: &Path,
    reference: &str,
    revision: Option<&str>,
) -> Result<(Vec<u8>, Value, String)> {
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
    let mut config = img.config.clone();
    if let Some(r) = revision {
        config["Labels"]["org.opencontainers.image.revision"] = json!(r);
    }
    let archive = oci::image_archive(&oci::ImageSpec {
        reference,
        layers: vec![img.layers[0].clone(), top],
        config: config.clone(),
    })?;
    Ok((archive.bytes, config, archive.manifest_digest))
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
    /// Env of the dranet container set over the manifest's (same name: replaced).
    env_over: Vec<(String, String)>,
    /// The dranet images imported: (reference, manifest digest).
    images: Vec<(String, String)>,
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
        let (archive, config, digest) = image_under_test(built, &d.image, None)?;
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
        let images = vec![(d.image.clone(), digest)];
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
            env_over: Vec::new(),
            images,
            ctrd,
        };
        // State dir: a shared mount, as a node's /run is (Bidirectional needs it).
        bind_shared(&node.state_dir(), &node.state_dir())?;
        Ok(node)
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Imports another image of the binary under test (`built`'s base and config, the label
    /// `org.opencontainers.image.revision` set to `revision`) under `reference`; its digest.
    async fn import_image(&mut self, built: &Path, reference: &str, revision: &str) -> Result<String> {
        let (archive, _, digest) = image_under_test(built, reference, Some(revision))?;
        let path = self.dir.join(format!("{revision}.oci.tar"));
        std::fs::write(&path, archive)?;
        self.ctrd
            .ctr(&["-n", "k8s.io", "images", "import", &path.display().to_string()])
            .with_context(|| format!("importing {reference}"))?;
        let t = Instant::now();
        while !self.cri.has_image(reference).await? {
            ensure!(
                t.elapsed() < Duration::from_secs(10),
                "CRI never saw {reference}: {:?}",
                self.cri.image_tags().await?
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.images.push((reference.to_owned(), digest.clone()));
        Ok(digest)
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
        if needs_propagation && !propagates(&real) && real == Path::new("/run/netns") {
            // As the runtimes do before their first pod netns (containerd's and CNI's netns
            // package, `ip netns add`): the netns dir becomes a shared mount of itself, so the
            // mounts made in it later reach the containers that mount it. A copy bound elsewhere
            // would not see them (this machine's `/` is private, and nothing may have run a pod
            // netns under /run/netns yet).
            bind_shared(&real, &real)?;
            return Ok(real.display().to_string());
        }
        if needs_propagation && !propagates(&real) {
            let p = self.dir.join("host").join(m.host_path.trim_start_matches('/'));
            bind_shared(&real, &p)?;
            return Ok(p.display().to_string());
        }
        Ok(real.display().to_string())
    }

    /// RunPodSandbox + CreateContainer + StartContainer of the DaemonSet's pod, as kubelet.
    async fn run_dranet(&mut self) -> Result<Duration> {
        let image = self.d.image.clone();
        self.run_dranet_image(&image).await
    }

    /// [`ImageNode::run_dranet`] from the image `image` (the pod template after an update).
    async fn run_dranet_image(&mut self, image: &str) -> Result<Duration> {
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
                image: image.to_owned(),
                user_specified_image: image.to_owned(),
                ..Default::default()
            }),
            args,
            envs: self
                .d
                .env
                .iter()
                .filter(|(k, _)| !self.env_over.iter().any(|(o, _)| o == k))
                .chain(&self.env_over)
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

    /// The daemon's `/metrics` (its `--bind-address` on the host network).
    async fn metrics(&self) -> Result<String> {
        let (code, body) =
            dranet_sim::node::http_get(&format!("127.0.0.1:{}", self.port), "/metrics").await?;
        ensure!(code == 200, "/metrics answered {code}: {body}");
        Ok(body)
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
    /// The log of the removed container (all of it: read once it exited).
    async fn remove_dranet(&mut self) -> Result<String> {
        let log = self.stop_dranet().await?;
        self.remove_dranet_pod().await?;
        Ok(log)
    }

    /// kubelet's StopContainer of the dranet container with the grace period (SIGTERM); returns
    /// once the daemon exited, with its whole log.
    async fn stop_dranet(&mut self) -> Result<String> {
        let (_, cid, _) = self.dranet.clone().context("no dranet pod")?;
        self.plugin = None;
        self.cri.stop_container(&cid, self.d.grace).await?;
        Ok(self.dranet_log())
    }

    /// The rest of the dranet pod's removal: StopPodSandbox, RemoveContainer, RemovePodSandbox.
    async fn remove_dranet_pod(&mut self) -> Result<()> {
        let (sid, cid, _) = self.dranet.clone().context("no dranet pod")?;
        self.cri.stop_pod_sandbox(&sid).await?;
        self.cri.remove_container(&cid).await?;
        self.cri.remove_pod_sandbox(&sid).await?;
        self.dranet = None;
        Ok(())
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

/// Unmounts and removes pod netns files a failure left under /var/run/netns.
fn drop_netns(paths: &[String]) {
    use nix::mount::{MntFlags, umount2};
    for ns in paths {
        if Path::new(ns).exists() {
            let _ = umount2(Path::new(ns), MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(ns);
        }
    }
}

impl Drop for ImageNode {
    fn drop(&mut self) {
        use nix::mount::{MntFlags, umount2};
        // Failure paths only: pods containerd did not remove leave their netns mounts.
        drop_netns(&self.netns);
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

/// The runtime's NRI plugin request timeout (both Debian builds: NRI's default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the tenant loop acts (runs a pod, or stops one) throughout the update.
const CHURN_EVERY: Duration = Duration::from_millis(150);
/// A bound on the whole rolling-update case.
const UPDATE_WITHIN: Duration = Duration::from_secs(240);

/// Where the rolling update is: the old daemon serves; from the old container's StopContainer
/// until the new one is ready (/readyz 200); the new daemon ready; every pod run while dranet was
/// away has its device.
const OLD: u8 = 0;
const AWAY: u8 = 1;
const NEW: u8 = 2;
const SETTLED: u8 = 3;

/// What the tenant pods share with the update.
#[derive(Default)]
struct Update {
    phase: std::sync::atomic::AtomicU8,
    /// Pods whose RunPodSandbox returned without their device (dranet away): (name, netns).
    without: std::sync::Mutex<Vec<(String, String)>>,
    /// Every tenant netns, removed by [`NetnsGuard`] if a failure leaves it.
    netns: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Update {
    fn phase(&self) -> u8 {
        self.phase.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn set(&self, p: u8) {
        self.phase.store(p, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The `time="YYYY-MM-DDTHH:MM:SS.fffffffffZ"` of a containerd log line, in seconds since the
/// Unix epoch.
fn containerd_log_time(line: &str) -> Option<f64> {
    let t = line
        .strip_prefix("time=\"")?
        .split('"')
        .next()?
        .strip_suffix('Z')?;
    let (date, clock) = t.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, "0"));
    let c: Vec<i64> = hms.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [h, mi, sec]) = (d.as_slice(), c.as_slice()) else {
        return None;
    };
    // Days from the civil date (Howard Hinnant's days_from_civil).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let frac: f64 = format!("0.{frac}").parse().ok()?;
    #[allow(clippy::cast_precision_loss)]
    Some((days * 86_400 + h * 3600 + mi * 60 + sec) as f64 + frac)
}

/// Removes the tenant netns mounts a failure left (containerd's removal removes them otherwise).
struct NetnsGuard(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Ok(v) = self.0.lock() {
            drop_netns(&v);
        }
    }
}

/// A tenant pod of the rolling update: one veth "NIC" claimed as `net0`.
struct Tenant {
    pod: CriPod,
    nic: String,
    ns: String,
    /// The update's phase when its RunPodSandbox was sent and when it returned.
    ran: Option<(u8, u8)>,
    /// Its device was in its netns when RunPodSandbox returned (before its container).
    at_sandbox: bool,
    /// The update's phase when it was stopped.
    stopped: Option<u8>,
    /// Stopped only at the end (runs through the update).
    keep: bool,
}

impl Tenant {
    fn new(tag: &str, nic: &Nic) -> Self {
        Self {
            pod: CriPod::new(tag),
            nic: nic.name.clone(),
            ns: String::new(),
            ran: None,
            at_sandbox: false,
            stopped: None,
            keep: false,
        }
    }

    fn running(&self) -> bool {
        self.ran.is_some() && self.stopped.is_none()
    }
}

/// kubelet's SyncPod of a tenant: RunPodSandbox; its device checked in its netns before the
/// container is created (with dranet serving: there, and gone from the host; a pod run while
/// dranet was away is listed for the check after the new daemon is ready); then its container.
async fn run_tenant(cri: &Cri, up: &Update, t: &mut Tenant) -> Result<()> {
    let sent = up.phase();
    let sid = cri.run_pod_sandbox(&t.pod.ident).await?;
    let back = up.phase();
    t.pod.sandbox = Some(sid.clone());
    t.ns = t.pod.netns(cri).await?;
    if let Ok(mut v) = up.netns.lock() {
        v.push(t.ns.clone());
    }
    t.ran = Some((sent, back));
    t.at_sandbox = netns_has(&t.ns, "net0");
    if t.at_sandbox {
        ensure!(
            !host_has(&t.nic),
            "{}: {} in its netns and in the host",
            t.pod.ident.name,
            t.nic
        );
    } else {
        ensure!(
            sent <= AWAY && back >= AWAY,
            "{}: RunPodSandbox returned without its device ({}) while dranet served (phase {sent} to {back})",
            t.pod.ident.name,
            t.nic
        );
        if let Ok(mut v) = up.without.lock() {
            v.push((t.pod.ident.name.clone(), t.ns.clone()));
        }
    }
    t.pod.container = Some(
        cri.create_and_start(&sid, &t.pod.ident, "app", SANDBOX_IMAGE)
            .await?,
    );
    Ok(())
}

/// kubelet's kill of a tenant then the garbage collector's removal; its device was still in its
/// netns up to the kill.
async fn stop_tenant(cri: &Cri, up: &Update, t: &mut Tenant) -> Result<()> {
    ensure!(
        netns_has(&t.ns, "net0"),
        "{}: net0 left the running pod (phase {})",
        t.pod.ident.name,
        up.phase()
    );
    t.stopped = Some(up.phase());
    t.pod.stop(cri).await?;
    t.pod.remove(cri).await
}

/// The tenant loop: every [`CHURN_EVERY`], alternately runs the next pod of its queue and stops
/// the oldest running pod whose device was seen in it (never a pod run while dranet was away
/// before the update settled, never one marked `keep`). Ends once the queue is closed and empty.
async fn churn(
    cri: Cri,
    up: std::sync::Arc<Update>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Tenant>,
) -> Result<Vec<Tenant>> {
    use tokio::sync::mpsc::error::TryRecvError;
    let mut waiting = std::collections::VecDeque::new();
    let mut seen: Vec<Tenant> = Vec::new();
    let mut closed = false;
    let mut run_turn = true;
    loop {
        loop {
            match queue.try_recv() {
                Ok(t) => waiting.push_back(t),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if closed && waiting.is_empty() {
            return Ok(seen);
        }
        let settled = up.phase() == SETTLED;
        let stoppable = seen
            .iter()
            .position(|t| t.running() && !t.keep && (t.at_sandbox || settled));
        let running = seen.iter().filter(|t| t.running()).count();
        if (run_turn || stoppable.is_none() || running < 2)
            && let Some(mut t) = waiting.pop_front()
        {
            run_tenant(&cri, &up, &mut t).await?;
            seen.push(t);
        } else if let Some(i) = stoppable.filter(|_| running >= 2) {
            stop_tenant(&cri, &up, &mut seen[i]).await?;
        }
        run_turn = !run_turn;
        tokio::time::sleep(CHURN_EVERY).await;
    }
}

/// A DaemonSet rolling update of dranet on the real containerd (issue 36), maxSurge 0 as the
/// manifest says: the old dranet pod (the manifest's image) is stopped with the grace period
/// (SIGTERM) and removed, then the new one is run from another image (same base and binary, its
/// own revision label, so its own digest). Tenant pods are run and stopped throughout by a loop,
/// and at the gap itself one is run and one stopped. Asserted: every tenant has its device in its
/// netns before its container is created, or (run while dranet was away) within 1 s of the new
/// daemon's readiness; no device left a running pod; every device comes home restored, no pin
/// left; no NRI answer of either daemon took the runtime's 2 s, and containerd logged no plugin
/// timeout. Printed: the gap (the old daemon's last NRI answer to the new one's first, from their
/// `NRI answer` log lines) and the slowest hook answer.
async fn rolling_update(test: &str, suite: &str) -> Result<()> {
    let Some(rt) = containerd::require(test, suite)? else {
        return Ok(());
    };
    let Some(built) = built_image(test)? else {
        return Ok(());
    };
    // The binary under test is built (when out of date) before the clock starts.
    dranet_bin()?;
    tokio::time::timeout(UPDATE_WITHIN, rolling_update_on(&rt, &built))
        .await
        .with_context(|| format!("the rolling update took over {UPDATE_WITHIN:?}"))?
}

async fn rolling_update_on(rt: &Runtime, built: &Path) -> Result<()> {
    use std::sync::Arc;
    let version = rt.upstream().to_owned();
    // Three tenants the update itself drives (one kept through it, one stopped and one run in the
    // gap), five in the loop's first batch (prepared by the old daemon), three in its second
    // (prepared by the new one).
    let (nics, before) = Nic::many_with_views(11)?;
    dranet_bin()?;
    let mut node = ImageNode::start(rt, built).await?;
    // Each NRI answer logged (debug) with its time: the gap and the hook times come from them.
    node.env_over = vec![(
        "RUST_LOG".to_owned(),
        "info,dranet::nri::service=debug".to_owned(),
    )];
    let new_image = format!("{}-next", node.d.image);
    let new_digest = node
        .import_image(built, &new_image, "rolling-update-next")
        .await?;
    let (old_image, old_digest) = node.images[0].clone();
    ensure!(
        old_digest != new_digest,
        "the two images have one digest {old_digest}"
    );
    println!(
        "containerd {version}: rolling update from {old_image} ({old_digest}) to {new_image} ({new_digest})"
    );
    node.run_dranet().await?;
    let up = Arc::new(Update::default());
    let _guard = NetnsGuard(up.netns.clone());
    let cri = node.cri.clone();
    let devices = |n: &Nic| vec![nic_device(n, device_config(0))];
    let mut kept = Tenant::new("upd-kept-", &nics[0]);
    kept.keep = true;
    let mut gone = Tenant::new("upd-gapstop-", &nics[1]);
    let mut gap = Tenant::new("upd-gaprun-", &nics[2]);
    for (t, n) in [(&kept, &nics[0]), (&gone, &nics[1]), (&gap, &nics[2])] {
        node.prepare(&t.pod, &devices(n)).await?;
    }
    run_tenant(&cri, &up, &mut kept).await?;
    run_tenant(&cri, &up, &mut gone).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for n in &nics[3..8] {
        let t = Tenant::new("upd-loop-", n);
        node.prepare(&t.pod, &devices(n)).await?;
        tx.send(t).map_err(|_| anyhow::anyhow!("the tenant loop ended"))?;
    }
    let looping = tokio::spawn(churn(cri.clone(), up.clone(), rx));
    // The loop runs pods with the old daemon first.
    let t = Instant::now();
    while up.netns.lock().map(|v| v.len()).unwrap_or(0) < 4 {
        ensure!(
            !looping.is_finished() && t.elapsed() < Duration::from_secs(60),
            "the tenant loop ran no pod with the old daemon"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The update: kubelet kills the old pod (StopContainer with the grace period: SIGTERM).
    up.set(AWAY);
    let update = Instant::now();
    let old_log = node.stop_dranet().await?;
    let stopped = update.elapsed();
    // The gap: a pod run and one stopped while no dranet runs, beside the loop's.
    let gap_run = {
        let (cri, up) = (cri.clone(), up.clone());
        tokio::spawn(async move {
            let r = run_tenant(&cri, &up, &mut gap).await;
            r.map(|()| gap)
        })
    };
    let gap_stop = {
        let (cri, up) = (cri.clone(), up.clone());
        tokio::spawn(async move {
            let r = stop_tenant(&cri, &up, &mut gone).await;
            r.map(|()| gone)
        })
    };
    node.remove_dranet_pod().await?;
    let removed = update.elapsed();
    // maxSurge 0: the new pod once the old one is gone.
    node.run_dranet_image(&new_image).await?;
    up.set(NEW);
    let ready = Instant::now();
    let gap = gap_run.await??;
    let gone = gap_stop.await??;
    // Validator off: a pod run while dranet was away has its device within 1 s of the return.
    let without = up.without.lock().map(|v| v.clone()).unwrap_or_default();
    ensure!(
        without.iter().any(|(n, _)| *n == gap.pod.ident.name),
        "the pod run in the gap ({}) had its device at RunPodSandbox: no gap? ran {:?}",
        gap.pod.ident.name,
        gap.ran
    );
    let mut late_ms = 0.0f64;
    for (name, ns) in &without {
        wait_for(
            "a device of a pod run while dranet was away, within 1 s of the new daemon's readiness",
            Duration::from_secs(1).saturating_sub(ready.elapsed()),
            || netns_has(ns, "net0"),
        )
        .await
        .with_context(|| format!("{name}; new daemon's log:\n{}", node.dranet_log()))?;
        late_ms = late_ms.max(ready.elapsed().as_secs_f64() * 1000.0);
    }
    up.set(SETTLED);
    println!(
        "containerd {version}: old daemon exited {stopped:?} after StopContainer, its pod removed at {removed:?}, new daemon ready at {:?}; {} pod(s) run while dranet was away, every device in its pod by {late_ms:.0} ms after readiness",
        ready - update,
        without.len()
    );
    // Pods prepared by the new daemon, run and stopped by the loop.
    for n in &nics[8..11] {
        let t = Tenant::new("upd-after-", n);
        node.prepare(&t.pod, &devices(n)).await?;
        tx.send(t).map_err(|_| anyhow::anyhow!("the tenant loop ended"))?;
    }
    drop(tx);
    let mut tenants = looping.await??;
    tenants.extend([kept, gone, gap]);
    // Every pod still running has its device, configured; then all are stopped and removed.
    for t in tenants.iter().filter(|t| t.running()) {
        let v = ip_in(&t.ns, &["-j", "addr", "show", "dev", "net0"])?;
        ensure!(
            v.contains("192.168.70.2") && !host_has(&t.nic),
            "{}: net0 in its pod: {v}",
            t.pod.ident.name
        );
    }
    for t in &mut tenants {
        if t.running() {
            stop_tenant(&cri, &up, t).await?;
        }
    }
    for (n, b) in nics.iter().zip(&before) {
        wait_restored(&n.name, b, HOME_WITHIN)
            .await
            .with_context(|| format!("{} not home; new daemon's log:\n{}", n.name, node.dranet_log()))?;
    }
    wait_for("no pin on the host", Duration::from_secs(5), || {
        node.host_pins().is_empty()
    })
    .await?;
    for t in &tenants {
        node.unprepare(&t.pod).await?;
    }
    let count = |p: u8| tenants.iter().filter(|t| t.stopped == Some(p)).count();
    let run_in = |p: u8| {
        tenants
            .iter()
            .filter(|t| t.ran.is_some_and(|(s, _)| s == p))
            .count()
    };
    println!(
        "containerd {version}: {} tenant pods: run with the old daemon {}, while away {}, with the new {}; stopped with the old {}, while away {}, after {}; every device home restored, no pin",
        tenants.len(),
        run_in(OLD),
        run_in(AWAY),
        run_in(NEW) + run_in(SETTLED),
        count(OLD),
        count(AWAY),
        count(NEW) + count(SETTLED)
    );
    ensure!(count(AWAY) >= 1, "no pod stopped while dranet was away");
    // The hooks: every answer of both daemons, and the gap between them.
    let (hist, which) = slowest_hook(&node.metrics().await?);
    let new_log = node.remove_dranet().await?;
    let (old_answers, new_answers) = (nri_answers(&old_log), nri_answers(&new_log));
    let last_old = old_answers
        .last()
        .with_context(|| format!("no NRI answer in the old daemon's log:\n{old_log}"))?;
    let first_new = new_answers
        .first()
        .with_context(|| format!("no NRI answer in the new daemon's log:\n{new_log}"))?;
    let gap_ms = (first_new.ts - last_old.ts) * 1000.0;
    let slowest = old_answers
        .iter()
        .chain(&new_answers)
        .max_by(|a, b| a.took_ms.total_cmp(&b.took_ms))
        .context("no answers")?;
    let hooks = old_answers.len() + new_answers.len();
    let unanswered = (nri_unanswered(&old_log), nri_unanswered(&new_log));
    let ctrd_log = node.ctrd.log_text();
    // What containerd logged of the plugin (its name is <index>-<name>).
    let nri_lines: Vec<&str> = ctrd_log.lines().filter(|l| l.contains("00-dranet")).collect();
    for l in &nri_lines {
        println!("containerd: {l}");
    }
    // A request past the timeout. (A request the runtime sends as the old daemon closes its
    // connection fails at once, "closing plugin 00-dranet, failed to handle <request> request:
    // ttrpc: closed", and the runtime completes it without dranet, as in the gap: counted
    // below; one dranet received and did not answer would be in `unanswered`.)
    let timeouts: Vec<&&str> = nri_lines
        .iter()
        .filter(|l| {
            let l = l.to_lowercase();
            ["timeout", "deadline exceeded", "timed out"]
                .iter()
                .any(|k| l.contains(k))
        })
        .collect();
    let at_close = nri_lines
        .iter()
        .filter(|l| l.contains("failed to handle"))
        .count();
    // containerd's view: the old connection closed, the new one connected and synchronized.
    let at = |what: &[&str], after: f64| {
        nri_lines
            .iter()
            .filter(|l| what.iter().all(|w| l.contains(w)))
            .filter_map(|l| containerd_log_time(l))
            .find(|t| *t >= after)
    };
    let closed = at(&["connection to plugin", "closed"], last_old.ts - 1.0);
    let synced = closed.and_then(|c| at(&["plugin", "connected"], c));
    let runtime_gap_ms = closed.zip(synced).map(|(c, s)| (s - c) * 1000.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "RESULT containerd {version} rolling update: gap {gap_ms:.1} ms (old daemon's last NRI answer {} to the new one's first {}), containerd's plugin connection closed to connected {runtime_gap_ms:.1?} ms, {at_close} request(s) sent to the closed connection; {hooks} NRI answers, slowest {:.1} ms ({}), new daemon's histogram slowest {:.1} ms {which}; StopContainer to new ready {:.0} ms; load average {}",
        last_old.method,
        first_new.method,
        slowest.took_ms,
        slowest.method,
        hist * 1000.0,
        (ready - update).as_secs_f64() * 1000.0,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    ensure!(
        old_answers.iter().chain(&new_answers).all(|a| a.ok),
        "an NRI answer was an error: {:?}",
        old_answers
            .iter()
            .chain(&new_answers)
            .filter(|a| !a.ok)
            .collect::<Vec<_>>()
    );
    ensure!(
        slowest.took_ms < REQUEST_TIMEOUT.as_secs_f64() * 1000.0 && hist < REQUEST_TIMEOUT.as_secs_f64(),
        "an NRI hook answered past the runtime's {REQUEST_TIMEOUT:?}: {slowest:?}, histogram {hist} {which}"
    );
    ensure!(
        timeouts.is_empty(),
        "containerd logged a plugin request timeout: {timeouts:?}"
    );
    ensure!(
        unanswered.0.is_empty() && unanswered.1.is_empty(),
        "NRI requests received and never answered: old daemon {:?}, new daemon {:?}",
        unanswered.0,
        unanswered.1
    );
    ensure!(
        gap_ms > 0.0,
        "the new daemon answered before the old one's last answer"
    );
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
    containerd_2_rolling_update_to_another_image_leaves_no_pod_without_its_devices =>
        rolling_update("containerd_2_rolling_update_to_another_image_leaves_no_pod_without_its_devices", "sid");
    containerd_1_7_rolling_update_to_another_image_leaves_no_pod_without_its_devices =>
        rolling_update("containerd_1_7_rolling_update_to_another_image_leaves_no_pod_without_its_devices", "trixie");
}

#[test]
fn containerd_log_times_are_epoch_seconds() {
    let t = |l: &str| containerd_log_time(l).unwrap();
    assert!(
        (t("time=\"2026-12-07T11:15:15.654055332Z\" level=info msg=x") - 1_796_642_115.654_055).abs() < 1e-5
    );
    assert!((t("time=\"2024-02-29T00:00:01Z\" level=info") - 1_709_164_801.0).abs() < 1e-6);
    assert_eq!(containerd_log_time("level=info msg=x"), None);
}
