package rlqs

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/policy"
)

// TestConfigDefaults checks the defaults and that each bad field is
// refused with ErrInvalidConfig.
func TestConfigDefaults(t *testing.T) {
	store, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Policies: func() *policy.Set { return nil }, Share: func(string, string) float64 { return 1 }, Store: store}
	c, err := base.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Interval != DefaultInterval || c.TTL != DefaultTTL || c.Margin != DefaultMargin || c.Reserve != DefaultReserve ||
		c.IdleAfter != DefaultIdleAfter || c.MaxStreams != DefaultMaxStreams || c.MaxBuckets != DefaultMaxBuckets ||
		c.MaxBucketIDBytes != DefaultMaxBucketIDBytes || c.Node != "node" || c.Clock == nil || c.Logger == nil || c.Request == nil {
		t.Fatalf("defaults: %+v", c)
	}
	for name, mod := range map[string]func(*Config){
		"no store":          func(c *Config) { c.Store = nil },
		"no policies":       func(c *Config) { c.Policies = nil },
		"no share":          func(c *Config) { c.Share = nil },
		"long node":         func(c *Config) { c.Node = "n123456789n123456789n123456789n123456789x" },
		"node bytes":        func(c *Config) { c.Node = "a:b" },
		"fractional TTL":    func(c *Config) { c.TTL = 2500 * time.Millisecond },
		"TTL under renewal": func(c *Config) { c.TTL = 2 * time.Second }, // interval 1 s + margin 1 s
		"TTL above max":     func(c *Config) { c.TTL = 2 * time.Minute },
		"negative margin":   func(c *Config) { c.Margin = -time.Second },
		"reserve NaN":       func(c *Config) { c.Reserve = math.NaN() },
		"reserve 0.95":      func(c *Config) { c.Reserve = 0.95 },
		"short interval":    func(c *Config) { c.Interval = time.Millisecond },
		"idle under round":  func(c *Config) { c.IdleAfter = 100 * time.Millisecond },
		"negative bound":    func(c *Config) { c.MaxStreams = -1 },
	} {
		c := base
		mod(&c)
		if _, err := c.withDefaults(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
