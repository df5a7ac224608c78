package bucket

// TokenLimitsWithheld is TokenLimits for a caller that withholds part of
// the share from the buckets it creates, as a regional node does
// (Request.Withheld): a take with these limits that finds its TokenState
// absent (never written, or idle past the TTL) starts the bucket with
// (share − withheld)·C tokens instead of full, writes it at once and
// refills it from there at f·r, exactly as Memory and Redis start the
// bucket of a Request with that Share and Withheld. A stored bucket is
// decided as with TokenLimits(share). Errors are TokenLimits' and a
// withheld share outside [0, share].
func (l *Prepared) TokenLimitsWithheld(share, withheld float64) (TokenLimits, error) {
	tl, err := l.TokenLimits(share)
	if err != nil {
		return TokenLimits{}, err
	}
	if !finite(withheld) || withheld < 0 || withheld > share {
		return TokenLimits{}, requestErr("withheld share %v outside [0, %v] (the share)", withheld, share)
	}
	tl.fill = fillUnits(tl.lim, share, withheld, l.capF)
	return tl, nil
}

// Stored reports whether a take at us (Unix microseconds) with limits l
// reads s as a stored bucket; false means the take creates it (never
// written, or idle past l's TTL), full or at l's fill. A caller that
// withholds part of the share only for buckets it creates (the
// simulator) asks it before working out the withheld part.
func (s *TokenState) Stored(us int64, l *TokenLimits) bool {
	return s.lw != 0 && us-(s.lw^tokenPresent) < l.ttlUs && float64(us)-s.ts < float64(l.ttlUs)
}
