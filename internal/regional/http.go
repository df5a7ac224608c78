package regional

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Drain turns the node not ready for good (Ready false, /readyz 503
// "draining") while it keeps deciding checks. Run calls it when asked to
// stop, before the drain period (DaemonConfig.Drain), so that load
// balancers and Envoy move away before connections close.
func (n *Node) Drain() { n.draining.Store(true) }

// Handler returns the node's HTTP endpoints: /metrics from g, /healthz
// (the process is up) and /readyz (200 only when policies are loaded, the
// share source is ready and the node is not draining).
func (n *Node) Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case n.draining.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("draining\n"))
		case n.set.Load() == nil:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("policies not loaded\n"))
		case !n.cfg.Shares.Ready():
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("shares not loaded\n"))
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
	})
	return mux
}
