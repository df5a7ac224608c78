package regional

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

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
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("regional: watch policies: %w", err)
	}
	defer w.Close()
	// Watch the directory: editors and Kubernetes ConfigMaps replace files
	// by renaming, which a watch on the file itself would lose.
	dir := path
	if !isDir(path) {
		dir = filepath.Dir(path)
	}
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("regional: watch policies in %s: %w", dir, err)
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
			n.log.Warn("policy watch error", "error", err)
		case <-fire:
			fire = nil
			if err := n.LoadPolicies(path); err != nil {
				n.log.Error("policy reload failed; keeping the last good policies", "path", path, "error", err)
				continue
			}
			n.log.Info("policies reloaded", "path", path, "policies", n.set.Load().Len())
		}
	}
}
