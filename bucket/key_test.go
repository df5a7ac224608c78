package bucket_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/quotacoord/quota/bucket"
)

// TestHashSubjectVectors pins HashSubject bit for bit: its output names
// Redis buckets, so a change would reset every hashed bucket of a
// deployment. The expected values are HMAC-SHA256 from crypto/hmac.
func TestHashSubjectVectors(t *testing.T) {
	tests := []struct {
		salt, raw, want string
	}{
		{"", "", "h-thNnmggU2ex3L5XXeMNfxf8Wl8STcVZT"},
		{"", "x", "h-TLyWCZpkZ84AJGHxBUm0iYJl6-YYi0Xv"},
		{"salt", "alice@example.com", "h-dxZyqF-6w6Ceo1Wetty8pvwNdDU8PLCR"},
		{"s\x00", "10.1.2.3", "h-9WxoCbsuslt5TIDrBnZfJutB9eHEAMXU"},
		{"pepper", strings.Repeat("k", 1024), "h-_vlMyF5_UU4Gh3Nu0ZNOUStRZrdZGygR"},
		{strings.Repeat("S", 300), "v", "h-mvI8V9JwP7dmQffCpsM5H0OoqIeXZbxz"},
		{"é", "\xff\x00raw", "h-2Y03BaQF-XbgVztWiC-uDYs8P8IdrCy6"},
	}
	for _, tt := range tests {
		got := bucket.HashSubject(tt.salt, tt.raw)
		if got != tt.want {
			t.Errorf("HashSubject(%.20q, %.20q) = %q, want %q", tt.salt, tt.raw, got, tt.want)
		}
		if b := bucket.HashSubjectBytes(tt.salt, []byte(tt.raw)); b != tt.want {
			t.Errorf("HashSubjectBytes(%.20q, %.20q) = %q, want %q", tt.salt, tt.raw, b, tt.want)
		}
		if err := bucket.ValidateSubject(got); err != nil {
			t.Errorf("HashSubject(%.20q, %.20q): %v", tt.salt, tt.raw, err)
		}
	}
}

// TestHashSubjectIsHMAC holds HashSubject to crypto/hmac over salts and
// values on both sides of the hash's block size: a subject is the keyed
// HMAC, so it cannot be reversed by hashing guesses without the salt.
func TestHashSubjectIsHMAC(t *testing.T) {
	for _, saltLen := range []int{0, 1, 32, 63, 64, 65, 200} {
		for _, rawLen := range []int{0, 1, 55, 56, 64, 255, 256, 257, 1024} {
			salt, raw := strings.Repeat("s", saltLen), strings.Repeat("r", rawLen)
			m := hmac.New(sha256.New, []byte(salt))
			m.Write([]byte(raw))
			want := "h-" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:24])
			if got := bucket.HashSubject(salt, raw); got != want {
				t.Errorf("HashSubject(salt of %d, raw of %d) = %q, want HMAC %q", saltLen, rawLen, got, want)
			}
		}
	}
}

// TestNewKeyValidation: NewKey rejects every subject and policy name
// outside their alphabets and lengths; NewSubjectKey gives the same key for
// a Subject and the same policy errors; ParseSubject the same subject
// errors.
func TestNewKeyValidation(t *testing.T) {
	tests := []struct {
		name, policy, subject string
		want                  error
	}{
		{"plain", "api.requests", "tenant-42", nil},
		{"underscore", "p_1", "a_b", nil},
		{"longest subject", "p", strings.Repeat("s", bucket.MaxSubjectLen), nil},
		{"longest policy", strings.Repeat("p", bucket.MaxPolicyNameLen), "s", nil},
		{"hashed", "p", bucket.HashSubject("salt", "a@b"), nil},
		{"empty subject", "p", "", bucket.ErrInvalidSubject},
		{"long subject", "p", strings.Repeat("s", bucket.MaxSubjectLen+1), bucket.ErrInvalidSubject},
		{"hash tag brace", "p", "a}b", bucket.ErrInvalidSubject},
		{"colon", "p", "a:b", bucket.ErrInvalidSubject},
		{"dot in subject", "p", "a.b", bucket.ErrInvalidSubject},
		{"space", "p", "a b", bucket.ErrInvalidSubject},
		{"high byte", "p", "a\xffb", bucket.ErrInvalidSubject},
		{"nul", "p", "a\x00", bucket.ErrInvalidSubject},
		{"empty policy", "", "s", bucket.ErrInvalidPolicyName},
		{"long policy", strings.Repeat("p", bucket.MaxPolicyNameLen+1), "s", bucket.ErrInvalidPolicyName},
		{"brace in policy", "p{x}", "s", bucket.ErrInvalidPolicyName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := bucket.NewKey(tt.policy, 7, tt.subject)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("NewKey(%q, 7, %q) error %v, want %v", tt.policy, tt.subject, err, tt.want)
			}
			sub, perr := bucket.ParseSubject(tt.subject)
			if errors.Is(tt.want, bucket.ErrInvalidSubject) {
				if !errors.Is(perr, bucket.ErrInvalidSubject) || !sub.IsZero() {
					t.Errorf("ParseSubject(%q) = %q, %v, want ErrInvalidSubject", tt.subject, sub, perr)
				}
				return
			}
			if perr != nil || sub.String() != tt.subject {
				t.Fatalf("ParseSubject(%q) = %q, %v", tt.subject, sub, perr)
			}
			k2, err2 := bucket.NewSubjectKey(tt.policy, 7, sub)
			if !errors.Is(err2, tt.want) || (err2 == nil) != (tt.want == nil) {
				t.Fatalf("NewSubjectKey error %v, want %v", err2, tt.want)
			}
			if k2 != k {
				t.Errorf("NewSubjectKey = %v, NewKey = %v", k2, k)
			}
			if err == nil && k.String() != "rl:v7:{"+tt.subject+"}:"+tt.policy {
				t.Errorf("key %q", k.String())
			}
		})
	}
	if _, err := bucket.NewSubjectKey("p", 1, bucket.Subject{}); !errors.Is(err, bucket.ErrInvalidSubject) {
		t.Errorf("NewSubjectKey of the zero Subject: %v, want ErrInvalidSubject", err)
	}
	h := bucket.HashedSubject("salt", "a@b")
	if h.String() != bucket.HashSubject("salt", "a@b") || bucket.HashedSubjectBytes("salt", []byte("a@b")) != h {
		t.Errorf("HashedSubject %q differs from HashSubject", h)
	}
}

// TestHashSubjectSaltsInterleaved: goroutines hashing with different
// salts at once, each salt replacing the other's precomputed key states,
// still get every salt's own HMAC.
func TestHashSubjectSaltsInterleaved(t *testing.T) {
	salts := []string{"node-salt", "decision-log", strings.Repeat("long", 20)}
	want := make(map[string]string)
	for _, salt := range salts {
		m := hmac.New(sha256.New, []byte(salt))
		m.Write([]byte("alice@example.com"))
		want[salt] = "h-" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:24])
	}
	var wg sync.WaitGroup
	errs := make(chan string, len(salts))
	for _, salt := range salts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if got := bucket.HashSubject(salt, "alice@example.com"); got != want[salt] {
					errs <- fmt.Sprintf("HashSubject(%q) = %q, want %q", salt, got, want[salt])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func BenchmarkHashSubject(b *testing.B) {
	for _, n := range []int{16, 200, 1024} {
		raw := strings.Repeat("r", n)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = bucket.HashSubject("salt", raw)
			}
		})
	}
}

func BenchmarkNewKeyHashed(b *testing.B) {
	s := bucket.HashedSubject("salt", "alice@example.com")
	b.Run("NewKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bucket.NewKey("api.requests", 3, s.String()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NewSubjectKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bucket.NewSubjectKey("api.requests", 3, s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
