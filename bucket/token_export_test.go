package bucket

// StoredToken is what a token bucket stores: ts (µs), tokens and the
// capacity it was written at (units), the last write (µs), and whether the
// bucket exists. Tests only.
type StoredToken struct {
	TS, Tokens, Lim float64
	LastWrite       int64
	Present         bool
}

// TokenStateBucket returns what s stores.
func TokenStateBucket(s *TokenState) StoredToken {
	if s.lw == 0 {
		return StoredToken{}
	}
	return StoredToken{s.ts, s.tokens, s.lim, s.lw ^ tokenPresent, true}
}

// StateBucket returns what a token bucket's s stores, as TokenStateBucket.
func StateBucket(s *State) StoredToken {
	if s.st.ttl == 0 {
		return StoredToken{}
	}
	return StoredToken{s.st.a, s.st.b, s.st.c, s.st.lastWrite, true}
}
