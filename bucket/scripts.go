package bucket

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

// The scripts are assembled from lua/: common.lua, then the algorithm
// file(s), then take.lua (the entry point, whose header lists KEYS, ARGV
// and the reply). Each algorithm has its own script; scriptAll holds every
// algorithm for TakeAll over buckets of different algorithms.
//
//go:embed lua/*.lua
var luaFiles embed.FS

var (
	scriptByAlg [len(algCodes)]*redis.Script
	scriptAll   *redis.Script
	sources     [len(algCodes)]string
	sourceAll   string
)

var algFiles = [...]string{
	algTB: "lua/token_bucket.lua",
	algFW: "lua/fixed_window.lua",
	algSW: "lua/sliding_window.lua",
	algSL: "lua/sliding_log.lua",
}

func init() {
	read := func(name string) string {
		b, err := luaFiles.ReadFile(name)
		if err != nil {
			panic("bucket: embedded script missing: " + name) // a build defect, not input
		}
		return string(b)
	}
	common, take := read("lua/common.lua"), read("lua/take.lua")
	all := common
	for alg, f := range algFiles {
		body := read(f)
		sources[alg] = common + body + take
		scriptByAlg[alg] = redis.NewScript(sources[alg])
		argHash[alg] = scriptByAlg[alg].Hash()
		all += body
	}
	sourceAll = all + take
	scriptAll = redis.NewScript(sourceAll)
	argHashAll = scriptAll.Hash()
}

// TokenBucketScript returns the source of the token-bucket script, for
// tools that load it themselves (such as scripts/bench-bucket.sh).
func TokenBucketScript() string {
	return sources[algTB]
}
