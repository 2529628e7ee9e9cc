// Over 500 lines: the 12 away × set-up × runtime cases share one body; the rest is the model checked against NRI's rules.
//! "Make the gap refusable" (issue 36): NRI's default validator requiring dranet, in the NRI
//! runtime harness ([`dranet_sim::nri_validator`]: containerd ≥ 2.2 and CRI-O with NRI ≥ v0.10 run the
//! same NRI code; Debian's containerd builds have no validator, see containerd_restarts.rs
//! `validator_config_is_inert`), with the real daemon, veth pairs standing in for NICs, as root.
//!
//! For each way dranet is away (SIGTERM as a DaemonSet update stops it, SIGKILL, a stall past the
//! 2 s request timeout by SIGSTOP) and each set-up (`required_plugins = ["dranet"]` for the whole
//! node, or the pod's `required-plugins.noderesource.dev/pod` annotation) on both runtimes' wire
//! habits: kubelet prepares the pod's claims, dranet is away when the runtime runs its sandbox
//! (RunPodSandbox completes without dranet: the validator never looks at it), and kubelet's
//! CreateContainer is refused with the runtime's exact text, retried every pod sync, until dranet
//! is back. The container that is finally created is created after its NIC reached the pod's
//! netns, and the NIC comes home restored at teardown.
//!
//! dranet's own DaemonSet pod, under the global requirement: its container is created while
//! dranet is away thanks to the toleration annotation deploy/daemonset.yaml gives it (the runtime
//! must be configured with that key), and refused without it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use dranet::nri::pb::nri as pb;
use dranet_sim::fixtures::{TestPod, nic_device, wait_for};
use dranet_sim::kernel::host_has;
use dranet_sim::kubelet::{PodSyncBackoff, create_container_with_retries};
use dranet_sim::nic::{Nic, wait_restored};
use dranet_sim::node::{Node, NodeOptions};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig, RuntimeError};
use dranet_sim::nri_validator::{
    DefaultValidatorConfig, PluginInstance, REQUIRED_PLUGINS_ANNOTATION, TOLERATION_ANNOTATION,
    effective_annotation, rejection, validate_required_plugins,
};
use serde_json::json;

/// The runtime's refusal of a container while dranet is away.
const REFUSED: &str = "validator \"00-default-validator\" rejected container adjustment, reason: validation error: required plugin \"dranet\" not present";

/// kubelet's pod sync back-off, shortened from 10 s (+ up to 50 % jitter) so a test takes
/// seconds; the jitter is kept.
const FAST_SYNC: PodSyncBackoff = PodSyncBackoff {
    period: Duration::from_millis(150),
    jitter: 0.5,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Away {
    /// SIGTERM (a DaemonSet rolling update).
    Stopped,
    /// SIGKILL (a crash, an OOM kill).
    Killed,
    /// SIGSTOP: the connection stays open and nothing answers; the runtime's next request times
    /// out (2 s) and the runtime drops dranet. SIGCONT ends it.
    Stalled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// `required_plugins = ["dranet"]` (every container of the node).
    Global,
    /// The validator on, nothing required globally; the pod carries
    /// `required-plugins.noderesource.dev/pod: "[dranet]"`.
    PerPod,
}

fn validator(setup: Setup) -> DefaultValidatorConfig {
    match setup {
        Setup::Global => DefaultValidatorConfig::global_dranet(),
        Setup::PerPod => DefaultValidatorConfig::per_pod(),
    }
}

fn node_opts(setup: Setup, flavor: Flavor) -> NodeOptions {
    NodeOptions {
        runtime: RuntimeConfig {
            flavor,
            validator: validator(setup),
            ..RuntimeConfig::default()
        },
        ..NodeOptions::default()
    }
}

fn container(sandbox: &pb::PodSandbox, name: &str) -> pb::Container {
    pb::Container {
        id: format!("c-{name}-{}", sandbox.id),
        pod_sandbox_id: sandbox.id.clone(),
        name: name.into(),
        ..Default::default()
    }
}

/// Whether link `link` is in netns `ns` (`ip -n`), callable from any task.
fn ns_has(ns: &str, link: &str) -> bool {
    std::process::Command::new("ip")
        .args(["-n", ns, "link", "show", "dev", link])
        .output()
        .is_ok_and(|o| o.status.success())
}

async fn case(away: Away, setup: Setup, flavor: Flavor) -> Result<()> {
    let (nic, before) = Nic::with_view()?;
    let mut node = Node::start(node_opts(setup, flavor)).await?;
    let mut p = TestPod::new("val-")?;
    if setup == Setup::PerPod {
        p.sandbox
            .annotations
            .insert(format!("{REQUIRED_PLUGINS_ANNOTATION}/pod"), "[dranet]".into());
    }
    p.prepare(
        &node,
        &[nic_device(
            &nic,
            json!({"interface": {"name": "net0", "addresses": ["192.168.78.2/24"]}}),
        )],
    )
    .await?;

    // dranet goes away; the runtime runs the pod's sandbox without it.
    match away {
        Away::Stopped => node.stop()?,
        Away::Killed => node.kill()?,
        Away::Stalled => node.pause()?,
    }
    let t = Instant::now();
    let run = node.runtime.run_pod_sandbox(&p.sandbox).await;
    match (away, &run) {
        (Away::Stopped | Away::Killed, Err(RuntimeError::NoPlugin)) => {}
        (Away::Stalled, Err(RuntimeError::Rpc(e))) if t.elapsed() >= Duration::from_millis(1900) => {
            eprintln!(
                "{away:?}: RunPodSandbox timed out after {:?} ({e}); dranet dropped",
                t.elapsed()
            );
        }
        _ => bail!(
            "RunPodSandbox with dranet {away:?}: {run:?} after {:?}",
            t.elapsed()
        ),
    }
    // The sandbox runs; Synchronize will list it.
    node.runtime.set_state(vec![p.sandbox.clone()], vec![]);
    ensure!(host_has(&nic.name), "the NIC left the host with dranet away");

    // kubelet creates the pod's container: refused while dranet is away, retried every sync.
    let rt = node.runtime.handle();
    let app = container(&p.sandbox, "app");
    let (sb, c) = (p.sandbox.clone(), app.clone());
    let ns = p.ns.name.clone();
    let kubelet = tokio::spawn(async move {
        let created = create_container_with_retries(&rt, &sb, &c, FAST_SYNC, Duration::from_secs(60)).await?;
        // The runtime creates the container as soon as CreateContainer returns: the NIC must be
        // in the pod's netns, under its claimed name, by then.
        let has = ns_has(&ns, "net0");
        anyhow::Ok((created, has))
    });
    // The NIC's arrival in the pod (it leaves the host's /sys/class/net), polled every ms.
    let watch = {
        let name = nic.name.clone();
        tokio::task::spawn_blocking(move || {
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                if !host_has(&name) {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            None
        })
    };
    // Away long enough for a few refused syncs.
    wait_for("three refused CreateContainer", Duration::from_secs(10), || {
        node.runtime.refusals().len() >= 3
    })
    .await?;
    ensure!(host_has(&nic.name), "the NIC left the host with dranet away");
    let returning = Instant::now();
    match away {
        Away::Stopped | Away::Killed => node.restart().await?,
        Away::Stalled => node.resume().await?,
    }
    // dranet has registered and answered Synchronize.
    let back = Instant::now();
    let (created, had_net0) = kubelet.await??;
    let arrived = watch.await?.context("the NIC never left the host")?;
    eprintln!(
        "{away:?}/{setup:?}/{flavor:?}: {} refused; from the restart (or SIGCONT): dranet connected and ready {:?}, NIC in the pod {:?}, container created {:?}",
        created.refused.len(),
        back.duration_since(returning),
        arrived.saturating_duration_since(returning),
        created.at.saturating_duration_since(returning)
    );
    ensure!(!created.refused.is_empty(), "never refused");
    for (_, msg) in &created.refused {
        ensure!(msg == REFUSED, "refusal text: {msg}");
    }
    ensure!(
        node.runtime.refusals().iter().all(|m| m == REFUSED),
        "{:?}",
        node.runtime.refusals()
    );
    ensure!(
        created.refused.iter().all(|(at, _)| *at < back),
        "refused after dranet was back"
    );
    ensure!(
        arrived < created.at,
        "container created {:?} before its NIC arrived",
        arrived.duration_since(created.at)
    );
    ensure!(had_net0, "CreateContainer answered before net0 was in the pod");
    let addr = p.ns.ip(&["-j", "addr", "show", "dev", "net0"])?;
    ensure!(
        addr.contains("192.168.78.2"),
        "net0 has not the claim's address: {addr}"
    );
    // The validator never looked at RunPodSandbox, only at CreateContainer.
    ensure!(
        node.runtime.refusals().len() == created.refused.len(),
        "refusals outside CreateContainer"
    );

    // Teardown in the runtime's order; the NIC comes home restored.
    match flavor {
        Flavor::Containerd => {
            p.stop(&node).await?;
            wait_for(
                "the NIC home after StopPodSandbox",
                Duration::from_secs(5),
                || host_has(&nic.name),
            )
            .await?;
            p.ns.remove_crio_style()?;
            p.remove(&node).await?;
        }
        Flavor::Crio => {
            p.ns.remove_crio_style()?;
            wait_for(
                "the NIC home before StopPodSandbox",
                Duration::from_secs(5),
                || host_has(&nic.name),
            )
            .await?;
            p.stop_and_remove(&node).await?;
        }
    }
    node.runtime.set_state(vec![], vec![]);
    wait_restored(&nic.name, &before, Duration::from_secs(2)).await?;
    node.unprepare(&p.claim).await?;
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    node.stop()?;
    Ok(())
}

dranet_sim::root_tests! {
    global_containerd_stopped_container_waits_for_its_devices =>
        case(Away::Stopped, Setup::Global, Flavor::Containerd);
    global_containerd_killed_container_waits_for_its_devices =>
        case(Away::Killed, Setup::Global, Flavor::Containerd);
    global_containerd_stalled_container_waits_for_its_devices =>
        case(Away::Stalled, Setup::Global, Flavor::Containerd);
    global_crio_stopped_container_waits_for_its_devices =>
        case(Away::Stopped, Setup::Global, Flavor::Crio);
    global_crio_killed_container_waits_for_its_devices =>
        case(Away::Killed, Setup::Global, Flavor::Crio);
    global_crio_stalled_container_waits_for_its_devices =>
        case(Away::Stalled, Setup::Global, Flavor::Crio);
    per_pod_containerd_stopped_container_waits_for_its_devices =>
        case(Away::Stopped, Setup::PerPod, Flavor::Containerd);
    per_pod_containerd_killed_container_waits_for_its_devices =>
        case(Away::Killed, Setup::PerPod, Flavor::Containerd);
    per_pod_containerd_stalled_container_waits_for_its_devices =>
        case(Away::Stalled, Setup::PerPod, Flavor::Containerd);
    per_pod_crio_stopped_container_waits_for_its_devices =>
        case(Away::Stopped, Setup::PerPod, Flavor::Crio);
    per_pod_crio_killed_container_waits_for_its_devices =>
        case(Away::Killed, Setup::PerPod, Flavor::Crio);
    per_pod_crio_stalled_container_waits_for_its_devices =>
        case(Away::Stalled, Setup::PerPod, Flavor::Crio);
}

/// deploy/daemonset.yaml's pod template: (annotations, first container's name).
fn daemonset_pod() -> Result<(HashMap<String, String>, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/daemonset.yaml");
    let ds: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(path)?)?;
    let tpl = &ds["spec"]["template"];
    let annotations = serde_json::from_value(tpl["metadata"]["annotations"].clone())
        .context("the pod template has no annotations")?;
    let name = tpl["spec"]["containers"][0]["name"]
        .as_str()
        .context("no container")?
        .to_owned();
    Ok((annotations, name))
}

/// dranet's own pod under the global requirement: while no dranet is connected (its DaemonSet
/// pod being replaced), the new dranet container is created only because the pod template
/// carries the toleration the runtime is configured with; without it, or with a runtime that
/// names no toleration key, it is refused and the node deadlocks (no dranet, so no container).
/// Tenant pods stay refused meanwhile.
async fn own_pod_tolerates() -> Result<()> {
    let (annotations, name) = daemonset_pod()?;
    ensure!(
        annotations.get(TOLERATION_ANNOTATION).map(String::as_str) == Some("true"),
        "deploy/daemonset.yaml's pod template lacks {TOLERATION_ANNOTATION}: \"true\": {annotations:?}"
    );
    let mut node = Node::start(node_opts(Setup::Global, Flavor::Containerd)).await?;
    node.stop()?;
    // hostNetwork: no network namespace path.
    let own = pb::PodSandbox {
        id: "own-dranet-sandbox".into(),
        name: "dranet-x7k2p".into(),
        uid: "own-dranet-uid".into(),
        namespace: "kube-system".into(),
        annotations: annotations.clone(),
        ..Default::default()
    };
    let c = container(&own, &name);
    let adjust = node
        .runtime
        .create_container(&own, &c)
        .await
        .context("dranet's own container, tolerating the missing dranet")?;
    ensure!(adjust.is_none(), "an adjustment with no plugin: {adjust:?}");
    // Without the annotation: refused.
    let bare = pb::PodSandbox {
        annotations: HashMap::new(),
        ..own.clone()
    };
    match node.runtime.create_container(&bare, &c).await {
        Err(RuntimeError::Refused(m)) => ensure!(m == REFUSED, "{m}"),
        other => bail!("untolerated own container: {other:?}"),
    }
    // A runtime configured without the toleration key ignores the annotation.
    node.runtime.set_validator(DefaultValidatorConfig {
        tolerate_missing_plugins_annotation: String::new(),
        ..DefaultValidatorConfig::global_dranet()
    });
    match node.runtime.create_container(&own, &c).await {
        Err(RuntimeError::Refused(m)) => ensure!(m == REFUSED, "{m}"),
        other => bail!("toleration honoured without the key configured: {other:?}"),
    }
    node.runtime
        .set_validator(DefaultValidatorConfig::global_dranet());
    // Any other pod of the node is refused meanwhile.
    let tenant = pb::PodSandbox {
        id: "tenant-sandbox".into(),
        name: "tenant".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    let tc = container(&tenant, "app");
    ensure!(
        matches!(
            node.runtime.create_container(&tenant, &tc).await,
            Err(RuntimeError::Refused(_))
        ),
        "a tenant container was created with dranet away"
    );
    // The new dranet registers; now the tenant container is created.
    node.restart().await?;
    node.runtime
        .create_container(&tenant, &tc)
        .await
        .context("tenant container with dranet back")?;
    node.stop()?;
    Ok(())
}

dranet_sim::root_tests! {
    own_daemonset_pod_is_created_while_dranet_is_away_only_with_the_toleration =>
        own_pod_tolerates();
}

fn pod(annotations: &[(&str, &str)]) -> pb::PodSandbox {
    pb::PodSandbox {
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn ctr(name: &str) -> pb::Container {
    pb::Container {
        name: name.into(),
        ..Default::default()
    }
}

fn dranet_at(index: &str) -> Vec<PluginInstance> {
    vec![
        PluginInstance::validator(),
        PluginInstance {
            name: "dranet".into(),
            index: index.into(),
        },
    ]
}

/// The model against containerd/nri's `validateRequiredPlugins`, `GetEffectiveAnnotation` and
/// `GetPluginMap` (v0.10.0–v0.12.x): scopes, matching by name or `<index>-<name>`, the
/// toleration, the exact texts.
#[test]
fn required_plugins_check_matches_nri() {
    let only_validator = vec![PluginInstance::validator()];
    let global = DefaultValidatorConfig::global_dranet();
    let per_pod = DefaultValidatorConfig::per_pod();
    let why = |cfg: &DefaultValidatorConfig, p: &pb::PodSandbox, c: &str, plugins: &[PluginInstance]| {
        validate_required_plugins(cfg, p, &ctr(c), plugins)
    };
    let missing = Err("validation error: required plugin \"dranet\" not present".to_owned());
    // Global: every container, whatever its pod.
    assert_eq!(why(&global, &pod(&[]), "app", &only_validator), missing);
    assert_eq!(why(&global, &pod(&[]), "app", &dranet_at("10")), Ok(()));
    // Matching by "<index>-<name>" as well as by name.
    let by_index = DefaultValidatorConfig {
        required_plugins: vec!["10-dranet".into()],
        ..global.clone()
    };
    assert_eq!(why(&by_index, &pod(&[]), "app", &dranet_at("10")), Ok(()));
    assert!(why(&by_index, &pod(&[]), "app", &dranet_at("20")).is_err());
    // The validator counts itself as present.
    let need_validator = DefaultValidatorConfig {
        required_plugins: vec!["default-validator".into(), "00-default-validator".into()],
        ..global.clone()
    };
    assert_eq!(why(&need_validator, &pod(&[]), "app", &only_validator), Ok(()));
    // Per pod: nothing required without the annotation; each scope; most specific wins.
    assert_eq!(why(&per_pod, &pod(&[]), "app", &only_validator), Ok(()));
    for key in [
        "required-plugins.noderesource.dev",
        "required-plugins.noderesource.dev/pod",
        "required-plugins.noderesource.dev/container.app",
    ] {
        for list in ["[dranet]", "[\"dranet\"]", "- dranet\n"] {
            let p = pod(&[(key, list)]);
            assert_eq!(
                why(&per_pod, &p, "app", &only_validator),
                missing,
                "{key}: {list}"
            );
            assert_eq!(why(&per_pod, &p, "app", &dranet_at("10")), Ok(()), "{key}");
        }
    }
    let scoped = pod(&[("required-plugins.noderesource.dev/container.app", "[dranet]")]);
    assert_eq!(why(&per_pod, &scoped, "sidecar", &only_validator), Ok(()));
    let narrowed = pod(&[
        ("required-plugins.noderesource.dev/pod", "[dranet]"),
        ("required-plugins.noderesource.dev/container.init", "[]"),
    ]);
    assert_eq!(why(&per_pod, &narrowed, "init", &only_validator), Ok(()));
    assert_eq!(why(&per_pod, &narrowed, "app", &only_validator), missing);
    // Several missing, global first then the annotation's, joined by ",".
    let two = pod(&[("required-plugins.noderesource.dev", "[other]")]);
    assert_eq!(
        why(&global, &two, "app", &only_validator),
        Err("validation error: required plugins \"dranet,other\" not present".to_owned())
    );
    assert!(
        why(
            &per_pod,
            &pod(&[("required-plugins.noderesource.dev", "{a: b}")]),
            "app",
            &only_validator
        )
        .is_err_and(|e| e.starts_with("invalid required-plugins.noderesource.dev annotation \"{a: b}\": "))
    );
    // The toleration: Go booleans, its own scopes, and it waives the per-pod list as well.
    for yes in ["true", "1", "t", "TRUE", "True"] {
        let p = pod(&[
            (TOLERATION_ANNOTATION, yes),
            ("required-plugins.noderesource.dev", "[x]"),
        ]);
        assert_eq!(why(&global, &p, "app", &only_validator), Ok(()), "{yes}");
    }
    let no = pod(&[(TOLERATION_ANNOTATION, "false")]);
    assert_eq!(why(&global, &no, "app", &only_validator), missing);
    let only_app = pod(&[(
        "tolerate-missing-nri-plugins.noderesource.dev/container.app",
        "true",
    )]);
    assert_eq!(why(&global, &only_app, "app", &only_validator), Ok(()));
    assert_eq!(why(&global, &only_app, "other", &only_validator), missing);
    assert_eq!(
        why(&global, &pod(&[(TOLERATION_ANNOTATION, "yes")]), "app", &only_validator),
        Err(
            "invalid tolerate-missing-nri-plugins.noderesource.dev annotation \"yes\": strconv.ParseBool: parsing \"yes\": invalid syntax"
                .to_owned()
        )
    );
    // No key configured: the annotation means nothing.
    let no_key = DefaultValidatorConfig {
        tolerate_missing_plugins_annotation: String::new(),
        ..global.clone()
    };
    assert_eq!(
        why(
            &no_key,
            &pod(&[(TOLERATION_ANNOTATION, "true")]),
            "app",
            &only_validator
        ),
        missing
    );
    // The error the CRI request fails with.
    assert_eq!(
        rejection(
            &PluginInstance::validator(),
            "validation error: required plugin \"dranet\" not present"
        ),
        REFUSED
    );
    let anns: HashMap<String, String> = HashMap::from([("k/pod".to_owned(), "v".to_owned())]);
    assert_eq!(effective_annotation(&anns, "k", "app"), Some("v"));
}

/// The config snippets docs/architecture.md shows, from the model's settings.
#[test]
fn config_snippets_name_the_runtimes_keys() {
    let g = DefaultValidatorConfig::global_dranet();
    assert_eq!(
        g.containerd_toml(),
        "[plugins.'io.containerd.nri.v1.nri'.default_validator]\n  enable = true\n  required_plugins = [\"dranet\"]\n  tolerate_missing_plugins_annotation = \"tolerate-missing-nri-plugins.noderesource.dev\"\n"
    );
    assert_eq!(
        g.crio_toml(),
        "[crio.nri.default_validator]\nnri_enable_default_validator = true\nnri_validator_required_plugins = [\"dranet\"]\nnri_validator_tolerate_missing_plugins_annotation = \"tolerate-missing-nri-plugins.noderesource.dev\"\n"
    );
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/architecture.md")).unwrap();
    for line in g.containerd_toml().lines().chain(g.crio_toml().lines()) {
        assert!(docs.contains(line.trim()), "docs/architecture.md lacks {line:?}");
    }
}

/// kubelet's pod sync back-off after a failed sync: 10 s plus up to 50 % jitter, every time.
#[test]
fn kubelet_pod_sync_backoff_is_10_to_15_s() {
    for _ in 0..100 {
        let d = PodSyncBackoff::KUBELET.delay();
        assert!(
            d >= Duration::from_secs(10) && d < Duration::from_secs(15),
            "{d:?}"
        );
    }
}
