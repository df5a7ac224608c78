package operatorclient

import "testing"

// TestPlaintextSafe: only targets that stay on this machine may carry a
// token in plaintext.
func TestPlaintextSafe(t *testing.T) {
	cases := []struct {
		target string
		want   bool
	}{
		{"127.0.0.1:8091", true},
		{"localhost:8091", true},
		{"[::1]:8091", true},
		{"dns:///localhost:8091", true},
		{"dns://8.8.8.8/127.0.0.1:8091", true},
		{"passthrough:///127.0.0.1:8091", true},
		{"unix:///run/quota/operator.sock", true},
		{"unix:relative.sock", true},
		{"unix-abstract:quota", true},
		{"192.0.2.10:8091", false},
		{"coordinator.internal:8091", false},
		{"dns:///coordinator.internal:8091", false},
		{"passthrough:///192.0.2.10:8091", false},
		{":8091", false},
		{"0.0.0.0:8091", false},
		{"xds:///coordinator", false},
		{"", false},
	}
	for _, c := range cases {
		if got := PlaintextSafe(c.target); got != c.want {
			t.Errorf("PlaintextSafe(%q) = %v, want %v", c.target, got, c.want)
		}
	}
}
