package logbuf

import (
	"bytes"
	"sync"
)

// DefaultMax is the bound of a Buffer whose Max is 0.
const DefaultMax = 64 << 20

// Buffer is an io.Writer that keeps what is written, up to Max bytes.
type Buffer struct {
	// Max bounds the bytes kept; 0 means DefaultMax. Set it before the
	// first Write.
	Max int

	mu      sync.Mutex
	b       bytes.Buffer
	dropped int
}

// Write keeps p when it fits under the bound and otherwise drops it whole
// (counted by Dropped). It never fails.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	limit := s.Max
	if limit <= 0 {
		limit = DefaultMax
	}
	if s.b.Len()+len(p) > limit {
		s.dropped += len(p)
		return len(p), nil
	}
	return s.b.Write(p)
}

// String returns what was kept.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Dropped returns how many bytes did not fit.
func (s *Buffer) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}
