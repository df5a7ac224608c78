package sim

import (
	"math"
	"math/rand/v2"
	"time"
)

// group is a compiled Group.
type group struct {
	Group
	n     int     // subjects First..First+n-1
	total float64 // offered rate of the whole group, requests per second
	alias *alias  // subject sampler when Zipf > 0
}

func compileGroups(s *Scenario, subjects int) []group {
	gs := make([]group, len(s.Groups))
	for i, g := range s.Groups {
		n := g.Count
		if n == 0 {
			n = int(math.Round(g.Fraction * float64(subjects)))
		}
		n = max(1, min(n, subjects-g.First))
		gs[i] = group{Group: g, n: n, total: g.Rate * s.RefillPerSecond * float64(n)}
		if g.Zipf > 0 {
			w := make([]float64, n)
			for k := range w {
				w[k] = math.Pow(float64(k+1), -g.Zipf)
			}
			gs[i].alias = newAlias(w)
		}
	}
	return gs
}

// weights writes the group's rate multiplier per region at t into out
// (their mean is 1 when no region is down and no flash is on).
func (g *group) weights(t time.Duration, up []bool, out []float64) {
	n := len(out)
	p := g.Profile
	ws := p.Weights
	if p.Kind == ProfileSteps {
		for _, st := range p.Steps {
			if t >= time.Duration(st.At) {
				ws = st.Weights
			}
		}
	}
	for i := range out {
		out[i] = 1
		if i < len(ws) {
			out[i] = ws[i]
		}
	}
	switch p.Kind {
	case ProfileDiurnal:
		for i := range out {
			out[i] *= 1 + p.Amplitude*math.Cos(2*math.Pi*(float64(t)/float64(p.Period)-float64(i)/float64(n)))
		}
	case ProfileHop:
		hop := int(t/time.Duration(p.Every)) % n
		for i := range out {
			out[i] = 0
		}
		out[hop] = 1
	}
	sum := 0.0
	for _, w := range out {
		sum += w
	}
	if sum == 0 {
		return
	}
	for i := range out {
		out[i] /= sum
	}
	if p.Kind == ProfileFlash && p.Region < n && t >= time.Duration(p.At) && t < time.Duration(p.At+p.For) {
		out[p.Region] *= p.Factor
	}
	// A down region's traffic moves to the live ones, by their weights.
	lost, liveSum := 0.0, 0.0
	for i := range out {
		if up[i] {
			liveSum += out[i]
		} else {
			lost += out[i]
			out[i] = 0
		}
	}
	if lost > 0 {
		for i := range out {
			if up[i] && liveSum > 0 {
				out[i] += lost * out[i] / liveSum
			}
		}
	}
}

// poisson draws a Poisson(lambda) count; lambda is split into chunks of at
// most 30 (a sum of independent Poisson counts is Poisson).
func poisson(r *rand.Rand, lambda float64) int {
	n := 0
	for lambda > 0 {
		l := math.Min(lambda, 30)
		lambda -= l
		limit, p := math.Exp(-l), r.Float64()
		for p > limit {
			n++
			p *= r.Float64()
		}
	}
	return n
}

// alias samples index k with probability w[k]/Σw in O(1) (Vose).
type alias struct {
	prob  []float64
	other []int32
}

func newAlias(w []float64) *alias {
	n := len(w)
	a := &alias{prob: make([]float64, n), other: make([]int32, n)}
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	scaled := make([]float64, n)
	var small, large []int32
	for i, v := range w {
		scaled[i] = v * float64(n) / sum
		if scaled[i] < 1 {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		a.prob[s], a.other[s] = scaled[s], l
		scaled[l] -= 1 - scaled[s]
		if scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	for _, i := range large {
		a.prob[i], a.other[i] = 1, i
	}
	for _, i := range small {
		a.prob[i], a.other[i] = 1, i
	}
	return a
}

func (a *alias) sample(r *rand.Rand) int {
	i := r.IntN(len(a.prob))
	if r.Float64() < a.prob[i] {
		return i
	}
	return int(a.other[i])
}
