#!/usr/bin/env bash
# The control plane at growing sizes (cmd/scale): a base point, then
# policies, nodes and regions each doubled twice, one markdown row per
# run into out/scale.md; then the leader killed at the largest of them
# (out/scale-failover.md); then one regional node's memory per policy and
# per live subject into out/scale-node.md.
#
# SCALE_POLICIES, SCALE_REGIONS, SCALE_NODES (per region), SCALE_MOVING
# (policies whose demand turns; default a tenth) and SCALE_DURATION set
# the base point; SCALE_NODE_POLICIES and SCALE_NODE_SUBJECTS the node's
# size. SCALE_LARGE=1 adds 10,000 policies × 12 regions × 2 nodes per
# region with a failover, and SCALE_TARGET=1 issue 17's target point,
# 10,000 policies × 12 regions × 25 nodes per region (300 nodes): both at
# a node's default report interval (5 s) and a deployment's election
# session TTL (5 s), with each node recording once per report and 150 s
# of warm-up. The large point takes about 5 minutes on a 2-core machine;
# the target point needs far more than that machine (docs/scale.md).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${SCALE_POLICIES:-500} R=${SCALE_REGIONS:-3} N=${SCALE_NODES:-2} D=${SCALE_DURATION:-30s}
M=${SCALE_MOVING:-$((P / 10))}
mkdir -p out bin
go build -o bin/scale ./cmd/scale
out=out/scale.md
common=(-report-interval 1s -rebalance-interval 1s -pressured 4 -duration "$D")
bin/scale -header -policies "$P" -moving "$M" -regions "$R" -nodes "$N" "${common[@]}" | tee "$out"
for k in 2 4; do
  bin/scale -policies $((P * k)) -moving $((M * k)) -regions "$R" -nodes "$N" "${common[@]}" | tee -a "$out"
done
for k in 2 4; do
  bin/scale -policies "$P" -moving "$M" -regions "$R" -nodes $((N * k)) "${common[@]}" | tee -a "$out"
done
for k in 2 4; do
  bin/scale -policies "$P" -moving "$M" -regions $((R * k)) -nodes "$N" "${common[@]}" | tee -a "$out"
done
bin/scale -header -failover -policies $((P * 4)) -moving $((M * 4)) -regions "$R" -nodes "$N" "${common[@]}" | tee out/scale-failover.md
large=(-failover -policies 10000 -moving 100 -records 1 -regions 12 -report-interval 5s -warmup 150s -duration 40s -session-ttl 5s)
if [[ ${SCALE_LARGE:-0} == 1 ]]; then
  bin/scale -header "${large[@]}" -nodes 2 | tee out/scale-large.md
fi
if [[ ${SCALE_TARGET:-0} == 1 ]]; then
  bin/scale -header "${large[@]}" -nodes 25 | tee out/scale-target.md
fi
bin/scale -node -header -policies "${SCALE_NODE_POLICIES:-10000}" -subjects "${SCALE_NODE_SUBJECTS:-1000000}" | tee out/scale-node.md
echo "tables: $out out/scale-failover.md out/scale-node.md"
