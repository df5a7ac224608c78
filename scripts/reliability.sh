#!/usr/bin/env bash
# make reliability: the fault, load and security suites in their long form
# (RELIABILITY_LONG=1, minutes), the randomized live runs checked against
# the cross-region bound (internal/e2e TestRandomRuns: BOUND_RUNS runs of
# BOUND_STEPS steps; BOUND_SEED replays one), the RLQS runs checked against
# the same bound (internal/rlqs: a node killed with leases out, a stream
# cut mid-assignment, a lease holder paused past its TTL, a shrink while a
# stream stalls), the live lease
# runs (internal/e2e TestLiveRLQSBound and TestLiveNodeLeaseBound for
# LEASE_SECONDS each, default 60), every existing
# fuzz target for FUZZTIME, then the summary table. Every redis-server and etcd the
# suites need is started by the tests themselves (internal/redistest, internal/etcdtest);
# with-redis.sh installs redis-server if missing and provides REDIS_ADDR.
# RELIABILITY_LONG=0 runs the short CI configuration instead.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=${RELIABILITY_OUT:-out/reliability}
fuzztime=${FUZZTIME:-20s}
mkdir -p "$out"
report="$(cd "$out" && pwd)/report.jsonl"
: > "$report"
export RELIABILITY_LONG=${RELIABILITY_LONG:-1} RELIABILITY_REPORT="$report"
status=0

echo "== suites (RELIABILITY_LONG=$RELIABILITY_LONG), log in $out/suites.log"
scripts/with-redis.sh "$GO" test -race -count=1 -timeout 40m -v ./internal/reliability/ >"$out/suites.log" 2>&1 || {
  status=1
  echo "suites failed:"; grep -E '^\s*(--- FAIL|FAIL|panic:)|_test.go:[0-9]+:' "$out/suites.log" | grep -v 'injected=true survived=true' | head -40
}

if [ "$RELIABILITY_LONG" = 1 ]; then
  bound_runs=${BOUND_RUNS:-6} bound_steps=${BOUND_STEPS:-20}
else
  bound_runs=${BOUND_RUNS:-3} bound_steps=${BOUND_STEPS:-8}
fi
echo "== bound: $bound_runs randomized live runs of $bound_steps steps, log in $out/bound.log"
E2E_RUNS=$bound_runs E2E_STEPS=$bound_steps E2E_SEED=${BOUND_SEED:-} \
  "$GO" test -race -count=1 -timeout 60m -v -run '^TestRandomRuns$' ./internal/e2e/ >"$out/bound.log" 2>&1 || {
  status=1
  echo "bound runs failed:"; grep -E '^\s*(--- FAIL|FAIL|panic:)|seed [0-9]+ \(|bound violated' "$out/bound.log" | head -40
}
grep -E 'runs of [0-9]+ steps' "$out/bound.log" | sed 's/^ */  /'

lease_seconds=${LEASE_SECONDS:-60}
echo "== leases live: 3 regions on Redis with a coordinator, RLQS Envoys and node leases, ${lease_seconds} s each, log in $out/leases.log"
LEASE_SECONDS=$lease_seconds E2E_SEED=${BOUND_SEED:-} \
  "$GO" test -count=1 -timeout 10m -v -run '^(TestLiveRLQSBound|TestLiveNodeLeaseBound)$' ./internal/e2e/ >"$out/leases.log" 2>&1 || {
  status=1
  echo "live lease runs failed:"; grep -E '^\s*(--- FAIL|FAIL|panic:)|seed [0-9]+ \(|bound violated|under-admission' "$out/leases.log" | head -40
}
grep -E 'under-admission' "$out/leases.log" | sed 's/^ */  /'

echo "== RLQS: a node killed with leases out, a stream cut mid-assignment, a lease holder paused past its TTL, a shrink while a stream stalls, log in $out/rlqs.log"
"$GO" test -race -count=1 -timeout 5m -v -run '^(TestNodeKilledWithLeasesOut|TestStreamCutMidAssignment|TestLeaseHolderPausedPastTTL|TestShrinkWhileStreamStalls)$' ./internal/rlqs/ >"$out/rlqs.log" 2>&1 || {
  status=1
  echo "RLQS runs failed:"; grep -E '^\s*(--- FAIL|FAIL|panic:)|over the bound' "$out/rlqs.log" | head -40
}

echo "== fuzz targets, $fuzztime each"
while IFS=: read -r file name; do
  dir=$(dirname "$file")
  log="$out/fuzz-$(echo "$dir" | tr / _)-$name.log"
  "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "./$dir" >"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "  $dir $name: exit $rc, $(grep -o 'execs: [0-9]*' "$log" | tail -1)"
  "$GO" run ./cmd/reliability fuzz -report "$report" -name "$dir.$name" -log "$log" -exit $rc || status=1
done < <(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | sed -e 's|^\./||' -e 's|:func |:|' | sort)

echo
"$GO" run ./cmd/reliability table -report "$report" || status=1
exit $status
