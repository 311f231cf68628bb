package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// wakeCauses are the causes of payments_idempotency_wait_wakeups_total,
// in the order they are printed.
var wakeCauses = []string{"notified", "timer", "lease", "deadline", "gone"}

// wakeups reads the service's count of waiting duplicates' wake-ups, by
// cause, from its /metrics.
func wakeups(base string) (map[string]float64, error) {
	res, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", res.Status)
	}
	out := map[string]float64{}
	const prefix = `payments_idempotency_wait_wakeups_total{cause="`
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		cause, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[cause] = v
		}
	}
	return out, sc.Err()
}

// wakeupLine says how the waiting duplicates of a phase were woken: the
// difference between two readings of wakeups.
func wakeupLine(before, after map[string]float64) string {
	var b strings.Builder
	b.WriteString("  waiting duplicates woken by:")
	for i, cause := range wakeCauses {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %.0f", cause, after[cause]-before[cause])
	}
	return b.String()
}
