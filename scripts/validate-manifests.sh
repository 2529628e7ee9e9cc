#!/usr/bin/env bash
# Validates every Kubernetes manifest under deploy/ and the Helm chart:
#   * the chart is rendered by Helm's own engine (helm-python-sdk, PyPI: the Helm v4 Go SDK
#     behind a C ABI; no helm binary is reachable here) with its default values, with every
#     value set (deploy/helm/dranet/ci/all-values.yaml) and with its objects switched off, and
#     checked by scripts/helm_check.py (golden default rendering, values shown, schema, lint);
#   * deploy/*.yaml and every rendering are validated against the Kubernetes 1.34 OpenAPI
#     schemas with kubernetes-validate (PyPI).
# Tools go into target/tools/kv once (idempotent, fast when present). DRANET_BLESS=1 rewrites
# deploy/helm/rendered/default.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/tools/kv
if ! "$venv/bin/python" -c 'import helm_python, yaml, kubernetes_validate' 2>/dev/null; then
  python3 -m venv "$venv" 2>/dev/null || { apt-get install -y -q python3-venv >/dev/null && python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q 'kubernetes-validate==1.37.0' 'helm-python-sdk==0.2.2' 'PyYAML>=6'
fi
rendered=target/tools/helm-rendered
rm -rf "$rendered" && mkdir -p "$rendered"
"$venv/bin/python" scripts/helm_check.py "$rendered"
mapfile -t files < <( (find deploy -name '*.yaml' ! -name kustomization.yaml ! -path 'deploy/helm/*'; find "$rendered" -name '*.yaml') | sort)
"$venv/bin/kubernetes-validate" --strict -k 1.34.0 "${files[@]}"
# kustomization.yaml has no Kubernetes schema: check it lists every manifest of deploy/.
for f in rbac.yaml deviceclass.yaml daemonset.yaml; do
  grep -qx "  - $f" deploy/kustomization.yaml || { echo "deploy/kustomization.yaml does not list $f"; exit 1; }
done
echo "manifests valid: ${#files[@]} files"
