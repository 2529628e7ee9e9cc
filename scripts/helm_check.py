"""Renders and checks the Helm chart (run by scripts/validate-manifests.sh).

The renderer is Helm's own engine: helm-python-sdk (PyPI) binds libhelm_c, a C ABI over Helm
v4's Go SDK, so `render` is `helm template` (Go text/template, Sprig, include/tpl, values
merging, values.schema.json) without the helm binary, which no registry reachable here ships.

Writes each rendering's manifests to OUT/<name>/ and checks:
  * default values: the output equals deploy/helm/rendered/default.yaml (the golden file the
    Rust tests read; DRANET_BLESS=1 rewrites it);
  * ci/all-values.yaml sets every key values.schema.json knows, passes the schema, and each of
    its values shows in the rendering;
  * rbac/serviceAccount/deviceClass off: no ClusterRole, ServiceAccount or DeviceClass, and the
    DaemonSet uses the named ServiceAccount;
  * the probes (startup and liveness on /healthz, readiness on /readyz) follow bindAddress: its
    port, and its host unless it is every interface (loopback too, IPv6 without brackets);
    --bind-address in extraArgs and a ServiceMonitor on a loopback bind are refused; OnDelete
    renders no rollingUpdate; NOTES.txt renders;
  * the schema refuses wrong values; every `.Values.x` a template reads is in values.yaml or the
    schema, and every key of values.yaml is read by a template;
  * `helm lint --strict` passes;
  * the DaemonSet's selector is upstream's (`app: dranet`), in deploy/ and in the chart.
"""
import json, os, pathlib, re, sys

import helm_python as helm
import yaml

CHART = pathlib.Path("deploy/helm/dranet")
GOLDEN = pathlib.Path("deploy/helm/rendered/default.yaml")
out = pathlib.Path(sys.argv[1])
failures = []


def fail(msg):
    failures.append(msg)


notes = {}


def render(name, values, namespace="kube-system"):
    with helm.Chart.load(str(CHART)) as c:
        c.validate_schema(values)
        m = c.render(values, name="dranet", namespace=namespace)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    docs = []
    text = ""
    for path in sorted(m):
        body = m[path]
        if path.endswith("NOTES.txt"):
            # Shown by `helm install`, not a manifest (`helm template` leaves it out too).
            notes[name] = body
            continue
        if not body.strip():
            continue
        (d / pathlib.Path(path).name).write_text(body)
        text += f"---\n# Source: {path}\n{body.strip()}\n"
        docs += [x for x in yaml.safe_load_all(body) if x]
    return text, docs


def kinds(docs, kind):
    return [x for x in docs if x.get("kind") == kind]


def render_fails(values, needle):
    """The chart refuses `values` at render time with a message containing `needle`."""
    try:
        with helm.Chart.load(str(CHART)) as c:
            c.validate_schema(values)
            c.render(values, name="dranet", namespace="kube-system")
    except helm.HelmError as e:
        if needle not in str(e):
            fail(f"chart with {values}: refused, but not for {needle!r}: {e}")
        return
    fail(f"chart with {values}: rendered, expected a refusal ({needle!r})")


def probes(ctr):
    """(path, port, host) of the startup, liveness and readiness probes."""
    got = {}
    for k in ("startupProbe", "livenessProbe", "readinessProbe"):
        g = (ctr.get(k) or {}).get("httpGet") or {}
        got[k] = (g.get("path"), g.get("port"), g.get("host"))
    return got


def check_pod(what, ds, port, host=None):
    """Probes on /healthz (startup, liveness) and /readyz (readiness) at port/host; hostPath types:
    nothing under /sys is type-checked, `Directory` only for kubelet's plugin dirs; on a node
    the old pod exits before the new one starts."""
    pod = ds["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    want = {"startupProbe": ("/healthz", port, host), "livenessProbe": ("/healthz", port, host),
            "readinessProbe": ("/readyz", port, host)}
    if probes(ctr) != want:
        fail(f"{what}: probes {probes(ctr)}, want {want}")
    if ctr["ports"][0]["containerPort"] != port:
        fail(f"{what}: containerPort {ctr['ports'][0]['containerPort']}, want {port}")
    for v in pod["volumes"]:
        hp = v.get("hostPath")
        if not hp:
            continue
        t = hp.get("type") or ""
        if hp["path"].startswith(("/sys/", "/proc/")) and t:
            fail(f"{what}: hostPath {hp['path']} has type {t!r}: a node without it could not start the pod")
        if t == "Directory" and not hp["path"].endswith(("/plugins", "/plugins_registry")):
            fail(f"{what}: hostPath {hp['path']} is type Directory; only kubelet's plugin dirs are mandatory")
    ru = ds["spec"]["updateStrategy"].get("rollingUpdate") or {}
    if ds["spec"]["updateStrategy"]["type"] == "RollingUpdate" and ru.get("maxSurge") not in (0, "0", "0%"):
        fail(f"{what}: updateStrategy {ds['spec']['updateStrategy']} lets two pods share a node")


def leaf_paths(v, prefix=""):
    if isinstance(v, dict) and v:
        for k, x in v.items():
            yield from leaf_paths(x, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix


schema = json.loads((CHART / "values.schema.json").read_text())
defaults = yaml.safe_load((CHART / "values.yaml").read_text())

# 1. Defaults, against the golden file.
text, docs = render("default", {})
header = "# `helm template dranet deploy/helm/dranet -n kube-system` (default values), written by\n# scripts/validate-manifests.sh (DRANET_BLESS=1); the Rust tests read its ClusterRole.\n"
if os.environ.get("DRANET_BLESS") == "1":
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(header + text)
elif not GOLDEN.exists() or GOLDEN.read_text() != header + text:
    fail(f"{GOLDEN} is not the chart rendered with its defaults: run DRANET_BLESS=1 bash scripts/validate-manifests.sh")
ds = kinds(docs, "DaemonSet")[0]
if ds["spec"]["selector"] != {"matchLabels": {"app": "dranet"}}:
    fail(f"chart: DaemonSet selector {ds['spec']['selector']} is not upstream's app: dranet")
if ds["metadata"]["name"] != "dranet":
    fail("chart: the DaemonSet of release dranet is not named dranet (upstream's name)")
if ds["spec"]["template"]["spec"].get("tolerations") != [{"operator": "Exists"}]:
    fail("chart: by default the DaemonSet must tolerate every taint")
for k in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount", "DeviceClass"):
    if not kinds(docs, k):
        fail(f"chart: no {k} with default values")
for k in ("Service", "ServiceMonitor"):
    if kinds(docs, k):
        fail(f"chart: a {k} with default values (serviceMonitor.enabled is false)")
check_pod("chart (defaults)", ds, 9177)
if "--bind-address=:9177" not in ds["spec"]["template"]["spec"]["containers"][0]["args"]:
    fail("chart (defaults): not --bind-address=:9177")
if ds["spec"]["updateStrategy"] != {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}:
    fail(f"chart (defaults): updateStrategy {ds['spec']['updateStrategy']}")
for needle in ("rollout status ds/dranet", "/proxy/readyz", "dranet status --state-dir /run/dranet"):
    if needle not in notes.get("default", ""):
        fail(f"NOTES.txt (defaults) lacks {needle!r}")

# 2. Every value set.
allv = yaml.safe_load((CHART / "ci/all-values.yaml").read_text())
set_paths = set(leaf_paths(allv))
def schema_paths(s, prefix=""):
    props = s.get("properties") or {}
    if not props:
        yield prefix
        return
    for k, sub in props.items():
        p = f"{prefix}.{k}" if prefix else k
        if sub.get("type") == "object" and sub.get("properties"):
            yield from schema_paths(sub, p)
        else:
            yield p
missing = [p for p in schema_paths(schema) if not any(x == p or x.startswith(p + ".") for x in set_paths)]
if missing:
    fail(f"ci/all-values.yaml does not set {missing}")
text, docs = render("all", allv, namespace="net-system")
ds = kinds(docs, "DaemonSet")[0]
pod = ds["spec"]["template"]["spec"]
ctr = pod["containers"][0]
expect = {
    "image": ctr["image"] == "registry.example.com/mirror/dranet:9.9.9",
    "pullPolicy": ctr["imagePullPolicy"] == "Always",
    "imagePullSecrets": pod.get("imagePullSecrets") == allv["imagePullSecrets"],
    "nodeSelector": pod.get("nodeSelector") == allv["nodeSelector"],
    "affinity": pod.get("affinity") == allv["affinity"],
    "tolerations": pod.get("tolerations") == allv["tolerations"],
    "priorityClassName": pod.get("priorityClassName") == allv["priorityClassName"],
    "serviceAccount.name": pod["serviceAccountName"] == "netdrv-sa",
    "podLabels": ds["spec"]["template"]["metadata"]["labels"].get("team") == "net",
    "podAnnotations": ds["spec"]["template"]["metadata"].get("annotations") == allv["podAnnotations"],
    "selector from nameOverride": ds["spec"]["selector"] == {"matchLabels": {"app": "netdrv"}},
    "fullnameOverride": ds["metadata"]["name"] == "netdrv-node",
    "resources": ctr["resources"] == allv["resources"],
    "extraVolumes": pod["volumes"][-1] == allv["extraVolumes"][0],
    "extraVolumeMounts": ctr["volumeMounts"][-1] == allv["extraVolumeMounts"][0],
    "logLevel": {"name": "RUST_LOG", "value": allv["logLevel"]} in ctr["env"],
    "metricsPort, bindAddress": ctr["ports"][0]["containerPort"] == 19177
        and probes(ctr)["readinessProbe"] == ("/readyz", 19177, "192.0.2.10"),
    "updateStrategy": ds["spec"]["updateStrategy"] == allv["updateStrategy"],
    "extraEnv": ctr["env"][-2:] == allv["extraEnv"],
    "kubeletRootDir": any(v.get("hostPath", {}).get("path") == "/var/lib/k0s/kubelet/plugins" for v in pod["volumes"]),
    "nriSocket": any(v.get("hostPath", {}).get("path") == "/run/containerd/nri" for v in pod["volumes"]),
    "stateDir": any(v.get("hostPath", {}).get("path") == "/run/netdrv" for v in pod["volumes"]),
    "serviceAccount.annotations": kinds(docs, "ServiceAccount")[0]["metadata"].get("annotations") == allv["serviceAccount"]["annotations"],
    "driverName (DeviceClass)": kinds(docs, "DeviceClass")[0]["metadata"]["name"] == "net.example.com",
    "driverName (RBAC)": any(r.get("resourceNames") == ["net.example.com"] for r in kinds(docs, "ClusterRole")[0]["rules"]),
}
args = ctr["args"]
for a in ["--driver-name=net.example.com", "--kubelet-root-dir=/var/lib/k0s/kubelet",
          "--nri-socket=/run/containerd/nri/nri.sock", "--state-dir=/run/netdrv",
          "--log-format=text", "--v=4", "--filter=", "--inventory-min-poll-interval=2s",
          "--inventory-max-poll-interval=1m30s", "--move-ib-interfaces=false",
          "--feature-gates=PersistentResourceSliceAttributes=true", "--pci-rebind",
          "--health-gone-grace-seconds=120", "--db-path=/var/run/dranet/dranet.db",
          "--inventory-poll-burst=5", "--cloud-provider-hint=NONE", "--profile-provider=none",
          "--webhook-url=unix:///run/webhook.sock", "--no-probes", "--bind-address=192.0.2.10:19177"]:
    expect[f"arg {a}"] = a in args
check_pod("chart (ci/all-values.yaml)", ds, 19177, "192.0.2.10")
svc, sm = (kinds(docs, "Service") or [{}])[0], (kinds(docs, "ServiceMonitor") or [{}])[0]
smv = allv["serviceMonitor"]
ep = ((sm.get("spec") or {}).get("endpoints") or [{}])[0]
expect["serviceMonitor (Service)"] = svc.get("spec", {}).get("clusterIP") == "None" \
    and svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"] \
    and svc["spec"]["ports"][0]["port"] == 19177 and svc["spec"]["ports"][0]["name"] == "metrics"
expect["serviceMonitor (selects the Service)"] = bool(sm) and all(
    svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
expect["serviceMonitor.labels"] = bool(sm) and sm["metadata"]["labels"].get("release") == "prometheus"
expect["serviceMonitor endpoint"] = ep.get("port") == "metrics" and ep.get("path") == "/metrics" \
    and ep.get("interval") == smv["interval"] and ep.get("scrapeTimeout") == smv["scrapeTimeout"] \
    and ep.get("metricRelabelings") == smv["metricRelabelings"]
for what, ok in expect.items():
    if not ok:
        fail(f"chart with ci/all-values.yaml: {what} not rendered as set")

# 3. Objects switched off.
off = {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing-sa"},
       "deviceClass": {"create": False}}
text, docs = render("off", off)
for k in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount", "DeviceClass"):
    if kinds(docs, k):
        fail(f"chart with {k} switched off still renders one")
if kinds(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["serviceAccountName"] != "existing-sa":
    fail("chart: serviceAccount.create=false does not use serviceAccount.name")

# 3b. The bind address, as the probes see it.
for values, port, host in [({"metricsPort": 19200}, 19200, None),
                           ({"bindAddress": "127.0.0.1:9300"}, 9300, "127.0.0.1"),
                           ({"bindAddress": "[::1]:9301"}, 9301, "::1"),
                           ({"bindAddress": "[::]:9302"}, 9302, None),
                           ({"bindAddress": "0.0.0.0:9303"}, 9303, None)]:
    name = "bind-" + str(port)
    text, docs = render(name, values)
    ds = kinds(docs, "DaemonSet")[0]
    check_pod(f"chart with {values}", ds, port, host)
    want = "--bind-address=" + (values.get("bindAddress") or f":{port}")
    if want not in ds["spec"]["template"]["spec"]["containers"][0]["args"]:
        fail(f"chart with {values}: no {want}")
if "curl -s http://127.0.0.1:9300/readyz" not in notes.get("bind-9300", ""):
    fail("NOTES.txt with a loopback bind does not say to curl it on the node")
if "curl -s http://[::1]:9301/readyz" not in notes.get("bind-9301", ""):
    fail("NOTES.txt with an IPv6 loopback bind does not bracket the address")
render_fails({"extraArgs": ["--bind-address=127.0.0.1:9177"]}, "set the bindAddress value")
render_fails({"extraArgs": ["-bind-address", "127.0.0.1:9177"]}, "set the bindAddress value")
render_fails({"bindAddress": "127.0.0.1:9177", "serviceMonitor": {"enabled": True}}, "cannot scrape")
render_fails({"bindAddress": ":70000"}, "must be 1-65535")
text, docs = render("ondelete", {"updateStrategy": {"type": "OnDelete"}})
if kinds(docs, "DaemonSet")[0]["spec"]["updateStrategy"] != {"type": "OnDelete"}:
    fail("chart: updateStrategy.type=OnDelete does not render alone")
text, docs = render("no-deviceclass", {"deviceClass": {"create": False}})
if "No DeviceClass created" not in notes.get("no-deviceclass", ""):
    fail("NOTES.txt with deviceClass.create=false does not say claims need a DeviceClass")

# 4. The schema refuses wrong values.
for bad in [{"tolerations": "all"}, {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
            {"bogus": 1}, {"metricsPort": 0}, {"args": {"inventoryMinPollInterval": "2 seconds"}},
            {"args": {"unknownArg": True}}, {"driverName": "Not_A_DNS_Name"},
            {"logVerbosity": "high"}, {"args": {"featureGates": "Foo"}},
            {"bindAddress": "9177"}, {"bindAddress": "localhost"}, {"bindAddress": "::1:9177"},
            {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
            {"updateStrategy": {"type": "Recreate"}}, {"extraEnv": [{"value": "x"}]},
            {"serviceMonitor": {"enabled": "yes"}}, {"serviceMonitor": {"interval": "30 seconds"}}]:
    with helm.Chart.load(str(CHART)) as c:
        try:
            c.validate_schema(bad)
            fail(f"values.schema.json accepts {bad}")
        except helm.HelmError:
            pass

# 5. Every value a template reads exists; every value is read.
refs = set()
for t in (CHART / "templates").glob("*"):
    refs |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", t.read_text()))
    for m in re.finditer(r"with \.Values\.args \}\}(.*?)\{\{- end \}\}\n\s*\{\{- range", t.read_text(), re.S):
        refs |= {"args." + k for k in re.findall(r"\s\.([A-Za-z]+)", m.group(1))}
known = set(schema_paths(schema)) | set(leaf_paths(defaults))
for r in sorted(refs):
    if not any(k == r or k.startswith(r + ".") for k in known):
        fail(f"a template reads .Values.{r}, which neither values.yaml nor the schema has")
for p in sorted(leaf_paths(defaults)):
    if not any(p == r or p.startswith(r + ".") for r in refs):
        fail(f"values.yaml: {p} is read by no template")

# 6. Lint.
res = helm.lint(str(CHART), strict=True)
errs = [m for m in res.get("messages", []) if m.get("severity", 0) >= 2] + list(res.get("errors") or [])
if errs:
    fail(f"helm lint --strict: {errs}")

# 7. deploy/daemonset.yaml keeps upstream's selector and name.
plain = yaml.safe_load(open("deploy/daemonset.yaml"))
if plain["spec"]["selector"] != {"matchLabels": {"app": "dranet"}} or plain["metadata"]["name"] != "dranet" \
        or plain["metadata"]["namespace"] != "kube-system":
    fail("deploy/daemonset.yaml: not upstream's kube-system/dranet with selector app: dranet")
check_pod("deploy/daemonset.yaml", plain, 9177)

if failures:
    print("\n".join("chart: " + f for f in failures), file=sys.stderr)
    sys.exit(1)
print(f"chart: rendered with helm {helm.helm_sdk_version()} (defaults, every value set, objects off, bind addresses); schema, probes, hostPaths, lint and value references checked")
