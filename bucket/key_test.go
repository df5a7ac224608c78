package bucket_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/quotacoord/quota/bucket"
)

// TestHashSubjectVectors pins HashSubject bit for bit: its output names
// Redis buckets, so a change would reset every hashed bucket of a
// deployment. The expected values were computed by the implementation
// before its allocation-free rewrite.
func TestHashSubjectVectors(t *testing.T) {
	tests := []struct {
		salt, raw, want string
	}{
		{"", "", "h-bjQLnP-zepicpUTmu3gKLHiQHT-zNzh2"},
		{"", "x", "h-PH6byTDck_AfppmF7yQtn56GHzxTVaok"},
		{"salt", "alice@example.com", "h-o99ov924XvJnlMcLniDrs8M_EpXLMflr"},
		{"s\x00", "10.1.2.3", "h-98YItTyTl48YktY9h-hZEMZUDrr8yBT2"},
		{"pepper", strings.Repeat("k", 1024), "h-9cMdumojetrpYpe8sEBG_rCkFt0IX60N"},
		{strings.Repeat("S", 300), "v", "h-wU_QjdagXnt7sb7l_wCowOAg9CPv-r2J"},
		{"é", "\xff\x00raw", "h-jqoI-owzm_D1WkfAr4xem3Wfr7f-boyQ"},
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
	s := bucket.HashSubject("salt", "alice@example.com")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bucket.NewKey("api.requests", 3, s); err != nil {
			b.Fatal(err)
		}
	}
}
