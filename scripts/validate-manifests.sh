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
mapfile -t files < <(find deploy -name '*.yaml' ! -name kustomization.yaml | sort)
"$venv/bin/kubernetes-validate" --strict -k 1.34.0 "${files[@]}"
# kustomization.yaml has no Kubernetes schema: check it lists every manifest of deploy/.
for f in rbac.yaml deviceclass.yaml daemonset.yaml; do
  grep -qx "  - $f" deploy/kustomization.yaml || { echo "deploy/kustomization.yaml does not list $f"; exit 1; }
done
echo "manifests valid: ${#files[@]} files"
