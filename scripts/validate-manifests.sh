#!/usr/bin/env bash
# Validates every Kubernetes manifest under deploy/ against the Kubernetes OpenAPI schemas with
# kubernetes-validate (PyPI), installed once into target/tools/kv (idempotent, fast when present).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/tools/kv
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv" 2>/dev/null || { apt-get install -y -q python3-venv >/dev/null && python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q 'kubernetes-validate==1.37.0'
fi
# The Helm chart's templates use plain value substitution only: render them with the default
# values (and fail on anything else), then validate like the plain manifests.
rendered=target/tools/helm-rendered
rm -rf "$rendered" && mkdir -p "$rendered"
"$venv/bin/python" - "$rendered" <<'PY'
import pathlib, re, sys, yaml
chart = pathlib.Path("deploy/helm/dranet")
values = yaml.safe_load((chart / "values.yaml").read_text())
def lookup(path):
    v = values
    for k in path.split("."):
        v = v[k]
    return str(v)
for t in sorted((chart / "templates").glob("*.yaml")):
    text = t.read_text().replace("{{ .Release.Namespace }}", "kube-system")
    text = re.sub(r"\{\{ \.Values\.([A-Za-z0-9_.]+) \}\}", lambda m: lookup(m.group(1)), text)
    if "{{" in text:
        sys.exit(f"{t}: template syntax beyond value substitution")
    (pathlib.Path(sys.argv[1]) / t.name).write_text(text)
PY
mapfile -t files < <( (find deploy -name '*.yaml' ! -name kustomization.yaml ! -path 'deploy/helm/*'; find "$rendered" -name '*.yaml') | sort)
"$venv/bin/kubernetes-validate" --strict -k 1.34.0 "${files[@]}"
# kustomization.yaml has no Kubernetes schema: check it lists every manifest of deploy/.
for f in rbac.yaml deviceclass.yaml daemonset.yaml; do
  grep -qx "  - $f" deploy/kustomization.yaml || { echo "deploy/kustomization.yaml does not list $f"; exit 1; }
done
# The reporter creates events and PATCHes repeats (count, lastTimestamp): both ClusterRoles must allow it.
"$venv/bin/python" - deploy/rbac.yaml "$rendered/rbac.yaml" <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    roles = [d for d in yaml.safe_load_all(open(path)) if d and d.get("kind") == "ClusterRole"]
    if not roles:
        sys.exit(f"{path}: no ClusterRole")
    for role in roles:
        verbs = set()
        for r in role.get("rules", []):
            if "" in r.get("apiGroups", []) and "events" in r.get("resources", []):
                verbs |= set(r.get("verbs", []))
        missing = {"create", "patch"} - verbs
        if missing:
            sys.exit(f"{path}: ClusterRole {role['metadata']['name']} lacks {sorted(missing)} on events")
PY
echo "manifests valid: ${#files[@]} files"
