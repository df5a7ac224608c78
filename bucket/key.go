package bucket

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
)

// MaxSubjectLen is the longest subject accepted in a key.
const MaxSubjectLen = 96

// MaxPolicyNameLen is the longest policy name accepted in a key.
const MaxPolicyNameLen = 64

// ErrInvalidSubject reports a subject outside [A-Za-z0-9_-]{1,96}.
var ErrInvalidSubject = errors.New("bucket: invalid subject")

// ErrInvalidPolicyName reports a policy name outside [A-Za-z0-9_.-]{1,64}.
var ErrInvalidPolicyName = errors.New("bucket: invalid policy name")

// Key names one subject's bucket for one version of one policy. The zero
// Key is invalid; build keys with NewKey so that only validated parts reach
// Redis.
type Key struct {
	policy  string
	version uint32
	subject string
}

// NewKey validates policy, version and subject and returns their key.
// Subjects must match [A-Za-z0-9_-]{1,96}; pass untrusted values through
// HashSubject first.
func NewKey(policy string, version uint32, subject string) (Key, error) {
	if err := ValidateSubject(subject); err != nil {
		return Key{}, err
	}
	if len(policy) == 0 || len(policy) > MaxPolicyNameLen {
		return Key{}, fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidPolicyName, len(policy), MaxPolicyNameLen)
	}
	for i := 0; i < len(policy); i++ {
		if c := policy[i]; !isSubjectByte(c) && c != '.' {
			return Key{}, fmt.Errorf("%w: byte %q at %d", ErrInvalidPolicyName, c, i)
		}
	}
	return Key{policy: policy, version: version, subject: subject}, nil
}

// ValidateSubject reports whether s may be used as a subject as it is.
func ValidateSubject(s string) error {
	if len(s) == 0 || len(s) > MaxSubjectLen {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidSubject, len(s), MaxSubjectLen)
	}
	for i := 0; i < len(s); i++ {
		if !isSubjectByte(s[i]) {
			return fmt.Errorf("%w: byte at %d is not in [A-Za-z0-9_-]", ErrInvalidSubject, i)
		}
	}
	return nil
}

func isSubjectByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// HashSubject turns an untrusted identity (a raw API key, an e-mail address,
// an IP) into a valid subject: "h-" and 32 URL-safe base64 characters of
// its SHA-256 under salt. The raw value never reaches a key, a log or a
// metric. The same salt and value always give the same subject.
func HashSubject(salt, raw string) string {
	h := sha256.New()
	h.Write([]byte(salt))
	h.Write([]byte{0})
	h.Write([]byte(raw))
	sum := h.Sum(nil)
	return "h-" + base64.RawURLEncoding.EncodeToString(sum[:24])
}

// Policy returns the key's policy name.
func (k Key) Policy() string { return k.policy }

// Version returns the key's policy version.
func (k Key) Version() uint32 { return k.version }

// Subject returns the key's subject.
func (k Key) Subject() string { return k.subject }

// IsZero reports whether k was not built by NewKey.
func (k Key) IsZero() bool { return k.subject == "" }

// String returns the Redis key, "rl:v{version}:{subject}:policy". The
// subject is a Redis Cluster hash tag, so every bucket of one subject lives
// in one slot.
func (k Key) String() string {
	b := make([]byte, 0, 8+len(k.subject)+len(k.policy)+10)
	b = append(b, "rl:v"...)
	b = strconv.AppendUint(b, uint64(k.version), 10)
	b = append(b, ":{"...)
	b = append(b, k.subject...)
	b = append(b, "}:"...)
	b = append(b, k.policy...)
	return string(b)
}
