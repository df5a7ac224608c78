package bucket

import (
	"crypto/sha256"
	"encoding"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync/atomic"
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
	// hash is keyHash of the parts, computed once by NewKey: Memory shards
	// and indexes buckets by it. Equal parts give equal hashes, so == on
	// Keys still compares the parts.
	hash uint64
}

// keySeed seeds keyHash for the life of the process.
var keySeed = maphash.MakeSeed()

// keyHash hashes a key's parts. A subject's buckets share the top bits'
// shard (see Memory), so the subject is hashed on its own first.
func keyHash(policy string, version uint32, subject string) uint64 {
	hs := maphash.String(keySeed, subject)
	var h maphash.Hash
	h.SetSeed(keySeed)
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], hs)
	binary.LittleEndian.PutUint32(b[8:], version)
	h.Write(b[:])
	h.WriteString(policy)
	// top byte from the subject alone: one shard per subject
	return hs&0xff00000000000000 | h.Sum64()&0x00ffffffffffffff
}

// NewKey validates policy, version and subject and returns their key.
// Subjects must match [A-Za-z0-9_-]{1,96}; pass untrusted values through
// HashSubject first.
func NewKey(policy string, version uint32, subject string) (Key, error) {
	if err := ValidateSubject(subject); err != nil {
		return Key{}, err
	}
	return newKey(policy, version, subject)
}

// NewSubjectKey is NewKey for a Subject, which is valid by construction:
// only the policy name is checked (and that the Subject is not zero).
func NewSubjectKey(policy string, version uint32, subject Subject) (Key, error) {
	if subject.s == "" {
		return Key{}, fmt.Errorf("%w: zero Subject", ErrInvalidSubject)
	}
	return newKey(policy, version, subject.s)
}

// newKey validates policy and builds the key of an already valid subject.
func newKey(policy string, version uint32, subject string) (Key, error) {
	if len(policy) == 0 || len(policy) > MaxPolicyNameLen {
		return Key{}, fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidPolicyName, len(policy), MaxPolicyNameLen)
	}
	for i := 0; i < len(policy); i++ {
		if c := policy[i]; !isSubjectByte(c) && c != '.' {
			return Key{}, fmt.Errorf("%w: byte %q at %d", ErrInvalidPolicyName, c, i)
		}
	}
	return Key{policy: policy, version: version, subject: subject, hash: keyHash(policy, version, subject)}, nil
}

// Subject is a subject known to match [A-Za-z0-9_-]{1,96}: made by
// HashedSubject or HashedSubjectBytes, or checked by ParseSubject. Build
// keys from it with NewSubjectKey, which does not check it again. The zero
// Subject is invalid. A Subject is an immutable value, safe to share.
type Subject struct{ s string }

// ParseSubject returns s as a Subject, or ValidateSubject's error.
func ParseSubject(s string) (Subject, error) {
	if err := ValidateSubject(s); err != nil {
		return Subject{}, err
	}
	return Subject{s}, nil
}

// HashedSubject is HashSubject(salt, raw) as a Subject.
func HashedSubject(salt, raw string) Subject {
	var out [HashedSubjectLen]byte
	hashSubject(&out, salt, raw, nil)
	return Subject{string(out[:])}
}

// HashedSubjectBytes is HashSubjectBytes(salt, raw) as a Subject.
func HashedSubjectBytes(salt string, raw []byte) Subject {
	var out [HashedSubjectLen]byte
	hashSubject(&out, salt, "", raw)
	return Subject{string(out[:])}
}

// String returns the subject; "" for the zero Subject.
func (s Subject) String() string { return s.s }

// IsZero reports whether s is the zero Subject.
func (s Subject) IsZero() bool { return s.s == "" }

// ValidateSubject reports whether s may be used as a subject as it is.
func ValidateSubject(s string) error {
	if len(s) == 0 || len(s) > MaxSubjectLen {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidSubject, len(s), MaxSubjectLen)
	}
	for i := 0; i < len(s); i++ {
		if !subjectBytes[s[i]] {
			return fmt.Errorf("%w: byte at %d is not in [A-Za-z0-9_-]", ErrInvalidSubject, i)
		}
	}
	return nil
}

// subjectBytes[c] is isSubjectByte(c): one load per byte in
// ValidateSubject, which runs on every check of a plain subject.
var subjectBytes = func() (t [256]bool) {
	for c := range t {
		t[c] = isSubjectByte(byte(c))
	}
	return t
}()

func isSubjectByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// HashSubject turns an untrusted identity (a raw API key, an e-mail address,
// an IP) into a valid subject: "h-" and 32 URL-safe base64 characters of
// HMAC-SHA256 keyed with salt over raw. The raw value never reaches a key,
// a log or a metric, and without the salt nobody can test guesses against
// a subject (an IPv4 address has only 2^32 values): the salt is a secret
// key, not a public prefix. The same salt and value always give the same
// subject. It allocates only the result.
func HashSubject(salt, raw string) string { return HashedSubject(salt, raw).s }

// HashSubjectBytes is HashSubject of string(raw), without converting raw.
func HashSubjectBytes(salt string, raw []byte) string { return HashedSubjectBytes(salt, raw).s }

// HashedSubjectLen is the length of every subject HashSubject returns.
const HashedSubjectLen = 2 + 32

// hashBlock is SHA-256's block size, the HMAC key's padded length.
const hashBlock = 64

// hashSubject writes "h-" and the URL-safe base64 of the first 24 bytes
// of HMAC-SHA256(salt, raw‖rawb) into out (one of raw and rawb is empty).
// It is RFC 2104 over stack buffers, starting from the SHA-256 states the
// salt's padded key blocks lead to (see hmacStates): two compressions of
// a short value instead of four. TestHashSubjectIsHMAC holds it to
// crypto/hmac.
func hashSubject(out *[HashedSubjectLen]byte, salt, raw string, rawb []byte) {
	st := hmacStatesOf(salt)
	// The digest stays on the stack (sha256.New is inlined and its calls
	// devirtualized); strings go through buf in chunks.
	h := sha256.New()
	u := h.(encoding.BinaryUnmarshaler)
	if err := u.UnmarshalBinary(st.inner[:]); err != nil {
		panic(err) // unreachable: marshaled by this package's SHA-256
	}
	var buf [256]byte
	for s := raw; len(s) > 0; {
		n := copy(buf[:], s)
		h.Write(buf[:n])
		s = s[n:]
	}
	h.Write(rawb)
	var inner [sha256.Size]byte
	h.Sum(inner[:0])
	if err := u.UnmarshalBinary(st.outer[:]); err != nil {
		panic(err)
	}
	h.Write(inner[:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	out[0], out[1] = 'h', '-'
	base64.RawURLEncoding.Encode(out[2:], sum[:24])
}

// hmacStates are the SHA-256 states, marshaled, after HMAC-SHA256 of one
// salt has hashed its inner padded key block (key ⊕ ipad) and its outer
// one (key ⊕ opad): every subject hashed with the salt starts from them,
// as crypto/hmac does after its first use, instead of compressing the two
// key blocks again. They are as secret as the salt.
type hmacStates struct {
	salt         string
	inner, outer [sha256StateLen]byte
}

// sha256StateLen is the length of a marshaled SHA-256 state: a 4-byte
// magic, 8 words of state, a 64-byte block and an 8-byte length.
const sha256StateLen = 4 + 8*4 + hashBlock + 8

// lastSalt holds the states of the salt hashed last: a node hashes with
// one salt (Config.SubjectSalt), so that is the one that counts; another
// salt replaces it and costs two more compressions and an allocation.
var lastSalt atomic.Pointer[hmacStates]

// hmacStatesOf returns salt's states, from lastSalt or computed.
func hmacStatesOf(salt string) *hmacStates {
	if st := lastSalt.Load(); st != nil && st.salt == salt {
		return st
	}
	st := &hmacStates{salt: salt}
	var key [hashBlock]byte
	if len(salt) > hashBlock {
		sum := sha256.Sum256([]byte(salt))
		copy(key[:], sum[:])
	} else {
		copy(key[:], salt)
	}
	var pad [hashBlock]byte
	for _, s := range []struct {
		x   byte
		out *[sha256StateLen]byte
	}{{0x36, &st.inner}, {0x5c, &st.outer}} {
		for i := range pad {
			pad[i] = key[i] ^ s.x
		}
		h := sha256.New()
		h.Write(pad[:])
		b, err := h.(encoding.BinaryMarshaler).MarshalBinary()
		if err != nil || len(b) != sha256StateLen {
			panic(fmt.Sprintf("bucket: marshal a SHA-256 state: %d bytes, %v", len(b), err))
		}
		copy(s.out[:], b)
	}
	lastSalt.Store(st)
	return st
}

// Policy returns the key's policy name.
func (k Key) Policy() string { return k.policy }

// Version returns the key's policy version.
func (k Key) Version() uint32 { return k.version }

// Subject returns the key's subject.
func (k Key) Subject() string { return k.subject }

// IsZero reports whether k was not built by NewKey.
func (k Key) IsZero() bool { return k.subject == "" }

// String returns the bucket's name in logs, errors and caches,
// "rl:v{version}:{subject}:policy". It is not where Redis stores the
// bucket: (*Redis).Location gives that key, whose hash tag is the subject's
// group, not the subject.
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
