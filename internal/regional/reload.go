package regional

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
)

// LoadPolicies loads path (a file or a directory of files) and swaps the
// set in. On error the node keeps its current set.
func (n *Node) LoadPolicies(path string) error {
	s, err := policy.Load(path)
	if err != nil {
		n.m.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("regional: load policies: %w", err)
	}
	n.SetPolicies(s)
	n.m.reloads.WithLabelValues("ok").Inc()
	return nil
}

// WatchPolicies reloads path whenever it (or, for a directory, a file in
// it) changes, until ctx is done. Changes are debounced by settle. A bad
// reload keeps the last good set and is logged with the reason. It blocks;
// run it in its own goroutine.
func (n *Node) WatchPolicies(ctx context.Context, path string, settle time.Duration) error {
	return n.watchFiles(ctx, []string{path}, settle, func() {
		if err := n.LoadPolicies(path); err != nil {
			n.log.Error("policy reload failed; keeping the last good policies", "path", path, "error", err)
			return
		}
		n.log.Info("policies reloaded", "path", path, "policies", n.set.Load().Len())
	})
}

// WatchGrants reloads the grants and tokens files (either may be empty)
// whenever one changes, until ctx is done, so that a rotated token or a
// revoked grant takes effect without a restart. Changes are debounced by
// settle; a bad file keeps the last good grants and tokens and is logged
// and counted (quota_regional_grants_reloads_total{result="error"}). It
// blocks; run it in its own goroutine.
func (n *Node) WatchGrants(ctx context.Context, grantsFile, tokensFile string, settle time.Duration) error {
	var paths []string
	for _, p := range []string{grantsFile, tokensFile} {
		if p != "" {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	return n.watchFiles(ctx, paths, settle, func() {
		if err := n.LoadGrants(grantsFile, tokensFile); err != nil {
			n.log.Error("grants reload failed; keeping the last good grants and tokens", "error", err)
			return
		}
		n.log.Info("grants reloaded", "grants", grantsFile, "tokens", tokensFile)
	})
}

// LoadGrants reads grantsFile and tokensFile (empty: the default grants,
// no tokens) and swaps them in together; on error the node keeps what it
// has.
func (n *Node) LoadGrants(grantsFile, tokensFile string) error {
	var g *grants.Grants
	var toks *grants.Tokens
	var err error
	if grantsFile != "" {
		g, err = grants.Load(grantsFile)
	}
	if err == nil && tokensFile != "" {
		toks, err = grants.LoadTokens(tokensFile)
	}
	if err != nil {
		n.m.grantsReloads.WithLabelValues("error").Inc()
		return fmt.Errorf("regional: load grants: %w", err)
	}
	n.SetGrants(g, toks)
	n.m.grantsReloads.WithLabelValues("ok").Inc()
	return nil
}

// watchFiles calls reload, debounced by settle, whenever one of paths
// (or, for a directory, a file in it) changes, until ctx is done. It
// watches the directories: editors and Kubernetes ConfigMaps and Secrets
// replace files by renaming, which a watch on the file itself would lose.
func (n *Node) watchFiles(ctx context.Context, paths []string, settle time.Duration, reload func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("regional: watch %v: %w", paths, err)
	}
	defer w.Close()
	for _, path := range paths {
		dir := path
		if !isDir(path) {
			dir = filepath.Dir(path)
		}
		if err := w.Add(dir); err != nil {
			return fmt.Errorf("regional: watch %s: %w", dir, err)
		}
	}
	var timer *time.Timer
	var fire <-chan time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue
			}
			if timer == nil {
				timer = time.NewTimer(settle)
			} else {
				timer.Reset(settle)
			}
			fire = timer.C
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			n.log.Warn("file watch error", "paths", paths, "error", err)
		case <-fire:
			fire = nil
			reload()
		}
	}
}
