#!/usr/bin/env bash
# Lints deploy/helm/kvindexd, renders it with every option that changes its
# shape, and checks deploy/manifests/kvindexd.yaml (the default rendering,
# for people without Helm) against a fresh render. --write updates it.
# Called by `make helm-check` / `make manifests` with HELM set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
HELM=${HELM:-helm}
chart=deploy/helm/kvindexd
out=deploy/manifests/kvindexd.yaml

render_default() {
  echo "# Rendered from deploy/helm/kvindexd with its default values by \`make manifests\`"
  echo "# (helm template kvindexd deploy/helm/kvindexd --namespace kvindex"
  echo "# --set peerRecovery.existingSecret=kvindexd-peer). Do not edit: change the chart and re-render."
  echo "# The replicas' peer token is not in this file (a rendering cannot keep a random one): create it first,"
  echo "# \`kubectl create namespace kvindex && kubectl -n kvindex create secret generic kvindexd-peer"
  echo "# --from-literal=peer-token=\$(head -c 32 /dev/urandom | base64)\`, then \`kubectl apply -f\` this file."
  "$HELM" template kvindexd "$chart" --namespace kvindex --set peerRecovery.existingSecret=kvindexd-peer
}

if [ "${1:-}" = "--write" ]; then
  render_default > "$out"
  echo "wrote $out"
  exit 0
fi

"$HELM" lint --strict "$chart"
# Every shape the chart can take must render and lint.
variants=(
  ""
  "--set snapshot.enabled=true"
  "--set discovery.enabled=false --set replicaCount=1 --set networkPolicy.enginePodSelector.matchLabels.app=vllm"
  "--set redis.url=redis://redis:6379/0 --set replicaCount=1"
  "--set redis.existingSecret=kv-redis --set discovery.enabled=false"
  "--set discovery.namespaces={*} --set serviceMonitor.enabled=true"
  "--set discovery.namespaces={llm-a,llm-b} --set tokenizers.volume.persistentVolumeClaim.claimName=tokenizers"
  "--set podDisruptionBudget.enabled=false --set networkPolicy.enabled=false --set service.zmq.enabled=false"
  "--set peerRecovery.enabled=false"
  "--set peerRecovery.existingSecret=my-peer-token --set networkPolicy.grpcHTTPFrom[0].podSelector.matchLabels.role=router"
)
for v in "${variants[@]}"; do
  # shellcheck disable=SC2086
  "$HELM" lint --strict "$chart" $v >/dev/null || { echo "helm lint failed with: $v" >&2; "$HELM" lint --strict "$chart" $v; exit 1; }
  # shellcheck disable=SC2086
  "$HELM" template kvindexd "$chart" --namespace kvindex $v >/dev/null || { echo "helm template failed with: $v" >&2; exit 1; }
done
# Combinations the chart must refuse, with its reason.
if "$HELM" template kvindexd "$chart" --set redis.url=redis://r:6379 --set replicaCount=2 >/dev/null 2>&1; then
  echo "helm template accepted discovery + Redis + 2 replicas (each replica would apply every event)" >&2; exit 1
fi
if "$HELM" template kvindexd "$chart" --set discovery.selector= >/dev/null 2>&1; then
  echo "helm template accepted discovery without a selector" >&2; exit 1
fi
# Peer recovery: on for more than one in-memory replica (selector, port,
# token file from the chart's Secret, a Role to list the pods), off for one
# replica, for Redis and when disabled.
peer=$("$HELM" template kvindexd "$chart" --namespace kvindex)
for want in '--peer-selector=app.kubernetes.io/instance=kvindexd,app.kubernetes.io/name=kvindexd' '--peer-port=8080' \
  '--peer-token-file=/etc/kvindexd-peer/peer-token' 'secretName: kvindexd-peer' 'name: kvindexd-peers' 'peer-token: '; do
  grep -qF -- "$want" <<<"$peer" || { echo "the default rendering lacks peer recovery's: $want" >&2; exit 1; }
done
for v in "--set replicaCount=1" "--set peerRecovery.enabled=false" "--set redis.url=redis://r:6379 --set discovery.enabled=false"; do
  # shellcheck disable=SC2086
  if "$HELM" template kvindexd "$chart" $v | grep -qE -- '--peer-|kvindexd-peer'; then
    echo "peer recovery rendered with: $v" >&2; exit 1
  fi
done
# Autoscaling on affinity pressure: off by default, a KEDA ScaledObject or
# an HPA on the external metric per listed model, refused without models.
if "$HELM" template kvindexd "$chart" | grep -qE 'kind: (ScaledObject|HorizontalPodAutoscaler)'; then
  echo "the default rendering scales something (autoscaling must be off by default)" >&2; exit 1
fi
scale=(--set-string "autoscaling.models[0].model=Qwen/Qwen3-8B" --set "autoscaling.models[0].scaleTargetRef.name=vllm-qwen3"
  --set "autoscaling.models[0].maxReplicas=8" --set-string "autoscaling.models[0].target=0.1" --set "autoscaling.models[0].namespace=llm")
keda=$("$HELM" template kvindexd "$chart" --namespace kvindex --set autoscaling.mode=keda "${scale[@]}")
"$HELM" lint --strict "$chart" --set autoscaling.mode=keda "${scale[@]}" >/dev/null
for want in 'kind: ScaledObject' 'namespace: llm' 'name: vllm-qwen3' 'maxReplicaCount: 8' 'type: prometheus' \
  'query: "sum(rate(kvindexd_pick_affinity_pressure_total{model=\"Qwen/Qwen3-8B\"}[2m]))"' 'threshold: "0.1"'; do
  grep -qF -- "$want" <<<"$keda" || { echo "the KEDA rendering lacks: $want" >&2; echo "$keda" | grep -A30 ScaledObject >&2; exit 1; }
done
hpa=$("$HELM" template kvindexd "$chart" --namespace kvindex --set autoscaling.mode=hpa "${scale[@]}")
"$HELM" lint --strict "$chart" --set autoscaling.mode=hpa "${scale[@]}" >/dev/null
for want in 'kind: HorizontalPodAutoscaler' 'type: External' 'name: kvindexd_pick_affinity_pressure' 'model_k8s: "Qwen_Qwen3-8B"' \
  'averageValue: "0.1"' 'maxReplicas: 8'; do
  grep -qF -- "$want" <<<"$hpa" || { echo "the HPA rendering lacks: $want" >&2; echo "$hpa" | grep -A30 HorizontalPodAutoscaler >&2; exit 1; }
done
if "$HELM" template kvindexd "$chart" --set autoscaling.mode=keda >/dev/null 2>&1; then
  echo "helm template accepted autoscaling without models" >&2; exit 1
fi
if "$HELM" template kvindexd "$chart" --set autoscaling.mode=vpa "${scale[@]}" >/dev/null 2>&1; then
  echo "helm template accepted an unknown autoscaling mode" >&2; exit 1
fi
if ! diff -u "$out" <(render_default) >/dev/null; then
  diff -u "$out" <(render_default) | head -50 >&2 || true
  echo "deploy/manifests/kvindexd.yaml is out of date: run make manifests" >&2
  exit 1
fi
echo "helm-check: chart lints and renders in ${#variants[@]} shapes; deploy/manifests is up to date"
