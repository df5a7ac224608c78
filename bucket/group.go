package bucket

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// DefaultGroups is the group count of a Redis store whose Groups is 0.
//
// The trade-off: every live group costs one Redis key (about 130 bytes:
// dict entry, key string, object header, expires entry) and a lookup or
// write scans the group's listpack, so fewer, larger groups save memory
// until a group holds more than Redis's hash-max-listpack-entries (128 by
// default) fields and turns into a hash table (about 80 bytes per field).
// 4096 groups keep a policy's groups listpack-encoded up to about 400,000
// live subjects (100,000 subjects: about 24 fields a group, the largest
// about 45) and cost about 0.5 MB of keys once every group is live.
const DefaultGroups = 4096

// MaxGroups bounds RedisConfig.Groups.
const MaxGroups = 1 << 20

// maxFieldSubject is the longest subject stored as a hash field as it is;
// a longer one is replaced by a 33-byte digest so that no field exceeds
// Redis's hash-max-listpack-value (64 by default), which would turn the
// whole group into a hash table.
const maxFieldSubject = 48

// groupOf returns the group of subject among groups: FNV-1a (32 bits) of
// the subject modulo groups. It depends on the subject only and is stable
// across processes, so every node of a region (configured with the same
// Groups) puts a subject in the same group.
func groupOf(subject string, groups uint32) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(subject); i++ {
		h ^= uint32(subject[i])
		h *= 16777619
	}
	return h % groups
}

// appendTag appends the hash tag of group g, "{g.<g>}". The '.' cannot
// occur in a subject, so a group tag never equals a subject's.
func appendTag(b []byte, g uint32) []byte {
	b = append(b, "{g."...)
	b = strconv.AppendUint(b, uint64(g), 10)
	return append(b, '}')
}

// groupKey is the Redis key of the token-bucket group g of k's policy and
// version: "rl:v<version>:{g.<g>}:<policy>". It is a hash: field = subject
// (see fieldOf), value = the bucket's 17 packed bytes (token_bucket.lua).
func groupKey(k *Key, g uint32) string {
	b := make([]byte, 0, 24+len(k.policy))
	b = append(b, "rl:v"...)
	b = strconv.AppendUint(b, uint64(k.version), 10)
	b = append(b, ':')
	b = appendTag(b, g)
	b = append(b, ':')
	b = append(b, k.policy...)
	return string(b)
}

// ownKey is the Redis key of a bucket that keeps a key of its own (window
// algorithms and the sliding log): "rl:v<version>:{g.<g>}:<policy>:<subject>".
// It shares the group's hash tag, so every bucket of one subject lives in
// one Redis Cluster slot whatever its algorithm. Policy names have no ':',
// so it never equals a group key.
func ownKey(k *Key, g uint32) string {
	// Built on the stack (a policy name and a subject fit in 256 bytes
	// with room to spare), so the string is the only allocation.
	var buf [256]byte
	b := buf[:0]
	b = append(b, "rl:v"...)
	b = strconv.AppendUint(b, uint64(k.version), 10)
	b = append(b, ':')
	b = appendTag(b, g)
	b = append(b, ':')
	b = append(b, k.policy...)
	b = append(b, ':')
	b = append(b, k.subject...)
	return string(b)
}

// fieldOf is k's field in its token-bucket group: the subject, or for a
// subject longer than maxFieldSubject "~" and 32 URL-safe base64
// characters of its SHA-256 ('~' cannot start a subject, so the two forms
// never meet).
func fieldOf(k *Key) string {
	if len(k.subject) <= maxFieldSubject {
		return k.subject
	}
	sum := sha256.Sum256([]byte(k.subject))
	return "~" + base64.RawURLEncoding.EncodeToString(sum[:24])
}

// grouped reports whether buckets of alg live as fields of group hashes.
// Only the token bucket does: its stored timestamp tells a stale field
// from a live one (see lua/token_bucket.lua).
func grouped(alg int) bool { return alg == algTB }

// Location returns where r keeps the bucket of k under lim: the Redis key
// and, for a token bucket, the field of that hash ("" for an algorithm
// that keeps a key of its own, a string). It is for tools and tests that
// inspect Redis; Key.String remains the bucket's name in logs and caches.
func (r *Redis) Location(k Key, lim Limits) (key, field string) {
	g := groupOf(k.subject, r.groups)
	switch lim.Algorithm {
	case "", TokenBucket:
		return groupKey(&k, g), fieldOf(&k)
	}
	return ownKey(&k, g), ""
}
