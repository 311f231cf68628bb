package main

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// phase is one thing to measure: op runs once per request, with a number
// unique in the run (seq), so that no two requests share a key by chance.
type phase struct {
	name string
	op   func(i int64) error
}

// result is one phase's figures.
type result struct {
	name     string
	n        int
	elapsed  time.Duration
	p50, p99 time.Duration
	turns    []float64 // requests/s in each round, when the phase took turns
}

func (r result) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r result) String() string {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("  %-38s %8.0f req/s   p50 %6.2f ms   p99 %6.2f ms   (%d requests)",
		r.name, r.rps(), ms(r.p50), ms(r.p99), r.n)
}

var seq atomic.Int64

// alternate measures phases compared with each other in turns: each runs
// for d in all, cut into rounds, so that all meet the same table sizes and
// the same noisy neighbours (one after the other, the later would meet a
// bigger table, and the ratio would measure that too). Round r runs them
// rotated by r/2, backwards in odd rounds, so that none mostly follows the
// same one and inherits its dirty pages or autovacuum. Each round's rate is
// kept, so that a ratio can be read round by round.
func alternate(c int, d time.Duration, phases ...phase) ([]result, error) {
	n := len(phases)
	count := 2 * n
	for count < 10 {
		count += 2 * n
	}
	count = max(1, min(count, int(d/(100*time.Millisecond)))) // a turn: a hundred requests at the slowest
	lats := make([][]time.Duration, n)
	out := make([]result, n)
	for r := range count {
		for j := range n {
			i := (r/2 + j) % n
			if r%2 == 1 {
				i = (r/2 + n - 1 - j) % n
			}
			lat, e, err := run1(phases[i], c, d/time.Duration(count))
			if err != nil {
				return nil, err
			}
			if len(lat) == 0 {
				return nil, fmt.Errorf("%s: a turn answered nothing", phases[i].name)
			}
			lats[i] = append(lats[i], lat...)
			out[i].elapsed += e
			out[i].turns = append(out[i].turns, float64(len(lat))/e.Seconds())
		}
	}
	for i, p := range phases {
		summarize(&out[i], p, lats[i])
		fmt.Println(out[i])
	}
	return out, nil
}

// run1 runs p on c workers for d: each worker sends its next request as
// soon as its last is answered.
func run1(p phase, c int, d time.Duration) ([]time.Duration, time.Duration, error) {
	var (
		mu    sync.Mutex
		lat   []time.Duration
		first error
		wg    sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for range c {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := p.op(seq.Add(1)); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if first != nil {
		return nil, 0, fmt.Errorf("%s: %w", p.name, first)
	}
	return lat, time.Since(start), nil
}

func summarize(r *result, p phase, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	r.name, r.n, r.p50, r.p99 = p.name, len(lat), pct(0.50), pct(0.99)
}

// ratio is a's rate over b's, over the whole phases, then the median and
// the range of the same ratio taken round by round (a and b from one
// alternate call): how far one round strays from another is the run's own
// noise.
func ratio(a, b result) string {
	s := fmt.Sprintf("%.2f", a.rps()/b.rps())
	if len(a.turns) < 2 || len(a.turns) != len(b.turns) {
		return s
	}
	rs := make([]float64, len(a.turns))
	for i := range rs {
		rs[i] = a.turns[i] / b.turns[i]
	}
	slices.Sort(rs)
	median := (rs[(len(rs)-1)/2] + rs[len(rs)/2]) / 2
	return fmt.Sprintf("%s   (by round: median %.2f, %.2f-%.2f)", s, median, rs[0], rs[len(rs)-1])
}
