package reliability

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
)

// redisEnv is a private redis-server reached by the node through a fault
// proxy, plus an admin client that bypasses the proxy.
type redisEnv struct {
	srv    *redistest.Server
	proxy  *faultproxy.Proxy
	admin  *redis.Client
	master *redistest.Server // for the read-only fault
}

// redisFault is one way Redis fails. inject and heal run while the load
// runs; refills counts how often the fault loses Redis's data.
type redisFault struct {
	name         string
	inject, heal func(t *testing.T, e *redisEnv)
	// normalOnly: the fault must not degrade any decision (Redis recovers
	// within the same call).
	normalOnly bool
	// modes are the degraded modes the fault must produce, default open,
	// closed and local; every other degraded mode is a failure.
	modes   []string
	refills int
	// observe, when set, tells whether the fault really happened, read
	// from Redis after the load: before is its reading before inject.
	observe func(t *testing.T, e *redisEnv) int64
}

// noscripts returns how many NOSCRIPT errors the server has answered
// (INFO errorstats), 0 before the first.
func noscripts(t *testing.T, e *redisEnv) int64 {
	t.Helper()
	info, err := e.admin.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := noscriptRE.FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

var noscriptRE = regexp.MustCompile(`errorstat_NOSCRIPT:count=(\d+)`)

func do(t *testing.T, c *redis.Client, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
}

func setMode(t *testing.T, p *faultproxy.Proxy, m faultproxy.Mode) {
	t.Helper()
	if err := p.SetMode(m); err != nil {
		t.Fatal(err)
	}
}

var redisFaults = []redisFault{
	{
		name:    "redis killed and restarted (script cache lost)",
		inject:  func(t *testing.T, e *redisEnv) { e.srv.Stop() },
		heal:    func(t *testing.T, e *redisEnv) { restart(t, e.srv) },
		refills: 1,
	},
	{
		name:       "redis script cache flushed",
		inject:     func(t *testing.T, e *redisEnv) { do(t, e.admin, "SCRIPT", "FLUSH") },
		heal:       func(t *testing.T, e *redisEnv) {},
		normalOnly: true,
		observe:    noscripts,
	},
	{
		name: "redis slowed by the proxy beyond the store timeout",
		inject: func(t *testing.T, e *redisEnv) {
			if err := e.proxy.SetLatency(time.Second); err != nil {
				t.Fatal(err)
			}
		},
		heal: func(t *testing.T, e *redisEnv) {
			if err := e.proxy.SetLatency(0); err != nil {
				t.Fatal(err)
			}
		},
	},
	{
		name:   "redis partitioned (blackhole)",
		inject: func(t *testing.T, e *redisEnv) { setMode(t, e.proxy, faultproxy.Blackhole) },
		heal:   func(t *testing.T, e *redisEnv) { setMode(t, e.proxy, faultproxy.Pass) },
	},
	{
		name:   "redis connections reset",
		inject: func(t *testing.T, e *redisEnv) { setMode(t, e.proxy, faultproxy.Reset) },
		heal:   func(t *testing.T, e *redisEnv) { setMode(t, e.proxy, faultproxy.Pass) },
	},
	{
		name: "redis full (maxmemory, noeviction)",
		inject: func(t *testing.T, e *redisEnv) {
			do(t, e.admin, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			do(t, e.admin, "CONFIG", "SET", "maxmemory", "1")
		},
		heal: func(t *testing.T, e *redisEnv) { do(t, e.admin, "CONFIG", "SET", "maxmemory", "0") },
		// A full Redis refuses to grow: every policy denies (closed),
		// whatever its failure mode; nothing is admitted open.
		modes: []string{"closed"},
	},
	{
		name: "redis read-only (became a replica)",
		inject: func(t *testing.T, e *redisEnv) {
			host, port, _ := strings.Cut(e.master.Addr, ":")
			do(t, e.admin, "REPLICAOF", host, port)
		},
		heal:    func(t *testing.T, e *redisEnv) { do(t, e.admin, "REPLICAOF", "NO", "ONE") },
		refills: 1,
	},
}

func restart(t *testing.T, s *redistest.Server) {
	t.Helper()
	if err := s.Restart(); err != nil {
		t.Fatalf("restart redis: %v", err)
	}
}

// faultStoreTimeout and faultBreakerCooldown are the node's store time
// budget and breaker cooldown in TestRedisFaults.
const (
	faultStoreTimeout    = 250 * time.Millisecond
	faultBreakerCooldown = 200 * time.Millisecond
)

// TestRedisFaults injects every Redis fault under load into a node run
// through regional.Run and checks that each decision follows its
// policy's failure mode, none is lost, fail-closed admissions stay within
// budget, and normal decisions resume by themselves.
func TestRedisFaults(t *testing.T) {
	before := pick(500*time.Millisecond, 3*time.Second)
	during := pick(1500*time.Millisecond, 10*time.Second)
	steady := pick(700*time.Millisecond, 5*time.Second)
	for _, f := range redisFaults {
		t.Run(f.name, func(t *testing.T) {
			e := &redisEnv{srv: redistest.Start(t), master: redistest.Start(t)}
			e.admin = e.srv.Client(t)
			p, err := faultproxy.Start(faultproxy.Config{Target: e.srv.Addr})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			e.proxy = p
			n := startNode(t, regional.DaemonConfig{Redis: p.Addr(), Policies: writePolicies(t, faultPolicies),
				StoreTimeout: faultStoreTimeout, BreakerThreshold: 3, BreakerCooldown: faultBreakerCooldown,
				Region: "r1"}, nil)
			d := newDriver(n.adm, redistest.Unique(t))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); d.run(ctx, 4, 2*time.Millisecond) }()
			stopLoad := func() { cancel(); <-done }
			defer stopLoad()

			time.Sleep(before)
			var observedBefore int64
			if f.observe != nil {
				observedBefore = f.observe(t, e)
			}
			// Only checks that start after the fault is in place and end
			// before it is healed count as decided during the fault.
			refuses := slices.Equal(f.modes, []string{"closed"})
			if refuses {
				d.refuseUntil.Store(math.MaxInt64)
				d.refuseFrom.Store(time.Now().UnixNano())
			}
			f.inject(t, e)
			d.phase.Store(phaseFault)
			time.Sleep(during)
			d.phase.Store(phaseAfter)
			f.heal(t, e)
			healedAt := time.Now()
			if refuses {
				// New subjects stay refused for one breaker cooldown.
				d.refuseUntil.Store(healedAt.Add(faultBreakerCooldown).UnixNano())
			}
			d.healed.Store(healedAt.UnixNano())
			ok := true
			deadline := time.Now().Add(20 * time.Second)
			for !d.recovered() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if !d.recovered() {
				ok = false
				t.Errorf("normal decisions did not resume within 20s")
			}
			recovery := d.recoveredAt().Sub(healedAt)
			// Once every policy decides normally again, allow a second for
			// calls already in flight, then nothing may be degraded.
			time.Sleep(time.Second)
			d.steady.Store(time.Now().UnixNano())
			time.Sleep(steady)
			stopLoad()

			decisions := d.during.snapshot()
			for _, msg := range d.problems() {
				ok = false
				t.Errorf("%s", msg)
			}
			if n := d.degradedWhenSteady.Load(); n > 0 {
				ok = false
				t.Errorf("%d degraded decisions after normal decisions resumed", n)
			}
			if f.normalOnly {
				for k, v := range decisions {
					if k != "normal" && v > 0 {
						ok = false
						t.Errorf("%d decisions degraded %q; this fault must be recovered within the call", v, k)
					}
				}
			} else {
				modes := f.modes
				if modes == nil {
					modes = []string{"open", "closed", "local"}
				}
				for _, m := range []string{"open", "closed", "local"} {
					want := slices.Contains(modes, m)
					if want && decisions[m] == 0 {
						ok = false
						t.Errorf("no %s-mode decision during the fault: %v", m, decisions)
					}
					if !want && decisions[m] > 0 {
						ok = false
						t.Errorf("%d %s-mode decisions during the fault, want only %v", decisions[m], m, modes)
					}
				}
				if n := d.normalAdmitDuring.Load(); n > 0 {
					ok = false
					t.Errorf("%d normal admissions while Redis could not write", n)
				}
			}
			if decisions["normal"]+decisions["open"]+decisions["closed"]+decisions["local"] == 0 {
				ok = false
				t.Errorf("no decision during the fault")
			}
			checked, viol := d.checkClosedBudget(t, 20, 20, f.refills)
			if strings.Contains(n.out.String(), "panic") {
				ok = false
				t.Errorf("the node logged a panic")
			}
			if err := n.stop(); err != nil {
				ok = false
				t.Errorf("node did not stop cleanly: %v", err)
			}
			injected := true
			if f.observe != nil {
				if n := f.observe(t, e) - observedBefore; n <= 0 {
					injected = false
					t.Errorf("the fault was not observed: no NOSCRIPT answered after it")
				}
			}
			// Every check waits at most one store timeout (and an eighth)
			// before its failure mode decides.
			mode, _, p99Budget := soakBudgets()
			p99Budget += faultStoreTimeout * 9 / 8
			p99 := d.lat.quantile(0.99)
			if p99 > p99Budget {
				ok = false
				t.Errorf("%s build: decision p99 %v over the budget %v", mode, p99, p99Budget)
			}
			record(t, Entry{Kind: KindFault, Name: f.name, Injected: injected, Survived: ok && !t.Failed(),
				Decisions: decisions, Lost: d.lost.Load(), InvariantChecks: checked, Violations: viol,
				Recovery: recovery, P99: p99,
				Note: fmt.Sprintf("checks %d, p99 budget %v", d.total.Load(), p99Budget)})
		})
	}
}
