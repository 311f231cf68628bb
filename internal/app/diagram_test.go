package app

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/idempotency"
)

// The state diagram of a record in docs/learn.md is checked against what
// moves a record: the queries that insert, delete, or set its status,
// recovery point or attempt. A new such query, or one that moves a record
// elsewhere than the diagram says, fails the test.

// learnersDiagram is docs/learn.md's Mermaid block.
func learnersDiagram(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/learn.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```mermaid\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/learn.md has no mermaid block")
	}
	return string(m[1])
}

// An edge of the diagram: from, to, and the queries its label names.
type edge struct {
	from, to string
	queries  []string
}

// learnersEdges is the diagram's edges, and its states (sorted, without
// the start and end, [*]).
func learnersEdges(t *testing.T) (edges []edge, states []string) {
	t.Helper()
	seen := map[string]bool{}
	line := regexp.MustCompile(`^\s*(\S+) --> (\S+): .*\(([A-Za-z, ]+)\)$`)
	for l := range strings.Lines(learnersDiagram(t)) {
		l = strings.TrimSpace(l)
		if !strings.Contains(l, "-->") {
			continue
		}
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("diagram line %q is not `FROM --> TO: who (Query, ...)`", l)
		}
		edges = append(edges, edge{m[1], m[2], strings.Split(m[3], ", ")})
		seen[m[1]], seen[m[2]] = true, true
	}
	delete(seen, "[*]")
	for s := range seen {
		states = append(states, s)
	}
	slices.Sort(states)
	return edges, states
}

func TestLearnersDiagramIsTheEngines(t *testing.T) {
	t.Parallel()
	edges, states := learnersEdges(t)
	// The states: a charge's recovery points while in progress, then the record's final statuses.
	want := []string{string(idempotency.RecoveryStarted), string(charges.RecoveryChargeCreated),
		string(idempotency.StatusCompleted), string(idempotency.StatusDead)}
	if !slices.Equal(states, slices.Sorted(slices.Values(want))) {
		t.Errorf("the diagram's states are %v; a charge's record has %v", states, want)
	}

	moves := recordMoves(t)
	named := map[string]bool{}
	for _, e := range edges {
		for _, q := range e.queries {
			named[q] = true
			sql, ok := moves[q]
			if !ok {
				t.Errorf("%s --> %s names %s, which is no query that moves a record", e.from, e.to, q)
				continue
			}
			if to := destination(sql, e.from); to != e.to {
				t.Errorf("%s --> %s names %s, which moves a record to %s", e.from, e.to, q, to)
			}
		}
	}
	for q := range moves {
		if !named[q] {
			t.Errorf("query %s moves a record, and the diagram has no edge for it", q)
		}
	}
}

// recordMoves reads db/queries/ for the queries that move a record, by name,
// with their SQL (comments dropped).
func recordMoves(t *testing.T) map[string]string {
	t.Helper()
	moves := map[string]string{}
	files, err := os.ReadDir("../../db/queries")
	if err != nil {
		t.Fatal(err)
	}
	// An UPDATE's SET clause, up to its FROM or WHERE.
	set := regexp.MustCompile(`(?s)UPDATE idempotency_keys\b.*?\bSET\b(.*?)\b(FROM|WHERE)\b`)
	moved := regexp.MustCompile(`\b(status|recovery_point|attempt)\s*=`)
	for _, f := range files {
		text, err := os.ReadFile("../../db/queries/" + f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range strings.Split(string(text), "-- name: ")[1:] {
			name, _, _ := strings.Cut(q, " ")
			var sql strings.Builder
			for l := range strings.Lines(q) {
				if !strings.HasPrefix(strings.TrimSpace(l), "--") {
					sql.WriteString(l)
				}
			}
			m := set.FindStringSubmatch(sql.String())
			moving := strings.Contains(sql.String(), "INSERT INTO idempotency_keys") ||
				strings.Contains(sql.String(), "DELETE FROM idempotency_keys") || m != nil && moved.MatchString(m[1])
			// (Not the bug planted for the soak to find, idempotency.Faults: never run otherwise.)
			if moving && name != "CompleteIdempotencyKeyUnfenced" {
				moves[name] = sql.String()
			}
		}
	}
	return moves
}

// destination is where the query sql moves a record that stands at from.
func destination(sql, from string) string {
	switch {
	case strings.Contains(sql, "DELETE FROM"):
		return "[*]"
	case strings.Contains(sql, "'dead'"):
		return string(idempotency.StatusDead)
	case strings.Contains(sql, "'completed'"):
		return string(idempotency.StatusCompleted)
	case strings.Contains(sql, "INSERT INTO"):
		return string(idempotency.RecoveryStarted)
	case strings.Contains(sql, "recovery_point = @recovery_point"):
		return string(charges.RecoveryChargeCreated) // the one recovery point a charge's first phase reaches
	default: // a takeover: the attempt alone changes
		return from
	}
}

// mermaidPath is Mermaid's standalone bundle, from the npm registry at a
// pinned version (make check-tools; .ci/run runs it).
const mermaidPath = "../../.cache/mermaid/package/dist/mermaid.min.js"

// The diagram renders: Mermaid, in Chromium, draws every state.
func TestLearnersDiagramRenders(t *testing.T) {
	t.Parallel()
	mermaid := npmTool(t, "Mermaid", mermaidPath)
	ctx := newTab(t, "about:blank", 1280, 800)
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](string(mermaid))); err != nil {
		t.Fatal(err)
	}
	src, err := json.Marshal(learnersDiagram(t))
	if err != nil {
		t.Fatal(err)
	}
	svg, err := chromedp.Run(ctx, chromedp.Evaluate[string](`mermaid.render("record", `+string(src)+`).then(r => r.svg)`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("Mermaid cannot draw the diagram: %v", err)
	}
	for _, state := range []string{"started", "charge_created", "completed", "dead", "InsertIdempotencyKey"} {
		if !strings.Contains(svg, state) {
			t.Errorf("the drawing has no %s", state)
		}
	}
}

// The demo page draws the same diagram without Mermaid (web/index.html's
// #states, one data-state attribute per state, lit by app.js): its states
// are exactly docs/learn.md's, each once.
func TestDemoDiagramHasTheLearnersStates(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../web/index.html")
	if err != nil {
		t.Fatal(err)
	}
	figure := regexp.MustCompile(`(?s)<figure id="states".*?</figure>`).Find(page)
	if figure == nil {
		t.Fatal(`web/index.html has no <figure id="states">, the key record's diagram`)
	}
	var drawn []string
	for _, m := range regexp.MustCompile(`\bdata-state="([^"]*)"`).FindAllSubmatch(figure, -1) {
		drawn = append(drawn, string(m[1]))
	}
	slices.Sort(drawn)
	if _, states := learnersEdges(t); !slices.Equal(drawn, states) {
		t.Errorf("the demo draws the states %v; docs/learn.md's diagram has %v", drawn, states)
	}
}
