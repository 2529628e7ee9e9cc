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
        if not body.strip():
            continue
        (d / pathlib.Path(path).name).write_text(body)
        text += f"---\n# Source: {path}\n{body.strip()}\n"
        docs += [x for x in yaml.safe_load_all(body) if x]
    return text, docs


def kinds(docs, kind):
    return [x for x in docs if x.get("kind") == kind]


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
    "metricsPort": ctr["ports"][0]["containerPort"] == 19177 and ctr["readinessProbe"]["httpGet"]["port"] == 19177,
    "kubeletRootDir": any(v.get("hostPath", {}).get("path") == "/var/lib/k0s/kubelet/plugins" for v in pod["volumes"]),
    "nriSocket": any(v.get("hostPath", {}).get("path") == "/run/containerd/nri" for v in pod["volumes"]),
    "stateDir": any(v.get("hostPath", {}).get("path") == "/run/netdrv" for v in pod["volumes"]),
    "serviceAccount.annotations": kinds(docs, "ServiceAccount")[0]["metadata"].get("annotations") == allv["serviceAccount"]["annotations"],
    "driverName (DeviceClass)": kinds(docs, "DeviceClass")[0]["metadata"]["name"] == "net.example.com",
    "driverName (RBAC)": any(r.get("resourceNames") == ["net.example.com"] for r in kinds(docs, "ClusterRole")[0]["rules"]),
}
args = ctr["args"]
for a in ["--driver-name=net.example.com", "--kubelet-root-dir=/var/lib/k0s/kubelet",
          "--nri-socket=/run/containerd/nri/nri.sock", "--state-dir=/run/netdrv", "--bind-address=:19177",
          "--log-format=text", "--v=4", "--filter=", "--inventory-min-poll-interval=2s",
          "--inventory-max-poll-interval=1m30s", "--move-ib-interfaces=false",
          "--feature-gates=PersistentResourceSliceAttributes=true", "--pci-rebind",
          "--health-gone-grace-seconds=120", "--db-path=/var/run/dranet/dranet.db",
          "--inventory-poll-burst=5", "--cloud-provider-hint=NONE", "--profile-provider=none",
          "--webhook-url=unix:///run/webhook.sock", "--no-probes"]:
    expect[f"arg {a}"] = a in args
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

# 4. The schema refuses wrong values.
for bad in [{"tolerations": "all"}, {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
            {"bogus": 1}, {"metricsPort": 0}, {"args": {"inventoryMinPollInterval": "2 seconds"}},
            {"args": {"unknownArg": True}}, {"driverName": "Not_A_DNS_Name"},
            {"logVerbosity": "high"}, {"args": {"featureGates": "Foo"}}]:
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

if failures:
    print("\n".join("chart: " + f for f in failures), file=sys.stderr)
    sys.exit(1)
print(f"chart: rendered with helm {helm.helm_sdk_version()} (defaults, every value set, objects off); schema, lint and value references checked")
