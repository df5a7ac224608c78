#!/usr/bin/env bash
# The control plane at growing sizes (cmd/scale): a base point, then
# policies, nodes and regions each doubled twice, one markdown row per
# run into out/scale.md, then one regional node's memory per policy and
# per live subject into out/scale-node.md. SCALE_POLICIES, SCALE_REGIONS,
# SCALE_NODES (per region) and SCALE_DURATION set the base point;
# SCALE_NODE_POLICIES and SCALE_NODE_SUBJECTS the node's size.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${SCALE_POLICIES:-100} R=${SCALE_REGIONS:-3} N=${SCALE_NODES:-4} D=${SCALE_DURATION:-20s}
mkdir -p out bin
go build -o bin/scale ./cmd/scale
out=out/scale.md
common=(-report-interval 1s -rebalance-interval 1s -pressured 4 -duration "$D")
bin/scale -header -policies "$P" -regions "$R" -nodes "$N" "${common[@]}" | tee "$out"
for k in 2 4; do
  bin/scale -policies $((P * k)) -regions "$R" -nodes "$N" "${common[@]}" | tee -a "$out"
done
for k in 2 4; do
  bin/scale -policies "$P" -regions "$R" -nodes $((N * k)) "${common[@]}" | tee -a "$out"
done
for k in 2 4; do
  bin/scale -policies "$P" -regions $((R * k)) -nodes "$N" "${common[@]}" | tee -a "$out"
done
bin/scale -node -header -policies "${SCALE_NODE_POLICIES:-10000}" -subjects "${SCALE_NODE_SUBJECTS:-1000000}" | tee out/scale-node.md
echo "tables: $out out/scale-node.md"
