package bucket

// TokenStateBucket returns what s stores: ts (µs), tokens (units), the last
// write (µs) and whether the bucket exists. Tests only.
func TokenStateBucket(s *TokenState) (ts, tokens float64, lastWrite int64, present bool) {
	if s.lw == 0 {
		return 0, 0, 0, false
	}
	return s.ts, s.tokens, s.lw ^ tokenPresent, true
}

// StateBucket returns what a token bucket's s stores, as TokenStateBucket.
func StateBucket(s *State) (ts, tokens float64, lastWrite int64, present bool) {
	if s.st.ttl == 0 {
		return 0, 0, 0, false
	}
	return s.st.a, s.st.b, s.st.lastWrite, true
}
