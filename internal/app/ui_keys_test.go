package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/testdb"
)

// The timeline's attempts, oldest first: each row's request, status,
// outcome and key, separated by tabs.
const attemptRows = `[...document.querySelectorAll("#attempts tbody tr")].reverse().map(r =>
	[1, 2, 3, 6].map(i => i === 6 ? r.children[i].title : r.children[i].textContent).join("\t")).join("\n")`

type attemptRow struct{ request, status, outcome, key string }

func readAttempts(t *testing.T, ctx context.Context) []attemptRow {
	t.Helper()
	var rows []attemptRow
	for line := range strings.SplitSeq(pageText(t, ctx, attemptRows), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			t.Fatalf("timeline row %q", line)
		}
		rows = append(rows, attemptRow{f[0], f[1], f[2], f[3]})
	}
	return rows
}

func formatRows(rows []attemptRow) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "  %s | %s | %s | %s\n", r.request, r.status, r.outcome, r.key)
	}
	return b.String()
}

// The demo as `make run` starts it, in the browser: arm a crash after the
// processor call and charge. The server dies with a real SIGKILL, its
// supervisor starts it again, and the page tells the story: the attempt
// the crash killed has its row, marked "connection lost"; the retries find
// the dead server's lease (409, in flight) until it lapses, and then take
// the charge over ("taken over"); the hint says what happened; and the
// processor's ledger, as the page shows it, has one effect.
//
// The reconciler is off here, so that the page's own retry is what takes
// the charge over. With it on (as in make run) it may get there first,
// and the page's retry is then answered with its result, "replayed".
func TestDemoPageCrashIsRecoveredOnce(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	addr, cmd := startCommand(t, "cmd/server", []string{"demo"}, "DATABASE_URL="+dbURL, "HTTP_ADDR=127.0.0.1:0",
		"IDEMPOTENCY_LEASE=2s", "PROCESSOR_TIMEOUT=1s", "RECONCILER_ENABLED=false")
	ctx := browser(t, "http://"+addr, 1280, 800)
	waitPage(t, ctx, `!document.getElementById("chaos").disabled`) // demo mode detected

	createOrderOnPage(t, ctx)
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("crash-point"), "after_processor_call")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "arm-crash")
	waitPage(t, ctx, `document.getElementById("demo-hint").textContent.startsWith("Armed")`)
	click(t, ctx, "charge")
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)

	rows := readAttempts(t, ctx)
	charge := rows[1:] // the first row is the order's
	if len(charge) < 2 {
		t.Fatalf("timeline:\n%s\nwant the charge's attempts: the one the crash killed, then the retries", formatRows(rows))
	}
	key := charge[0].key
	for _, r := range charge {
		if !strings.HasSuffix(r.request, "/charges") || r.key != key {
			t.Errorf("timeline:\n%s\nwant every charge attempt under the charge's one key", formatRows(rows))
			break
		}
	}
	if first := charge[0]; first.status != "connection lost" || first.outcome != "unknown" {
		t.Errorf("timeline:\n%s\nwant the first charge attempt, the one the crash killed, marked connection lost", formatRows(rows))
	}
	last := charge[len(charge)-1]
	if last.outcome != "taken over" {
		t.Errorf("timeline:\n%s\nwant the last attempt to have taken the charge over from the dead server", formatRows(rows))
	}
	for _, r := range charge[1 : len(charge)-1] {
		if !strings.HasPrefix(r.status, "409") || r.outcome != "in flight" {
			t.Errorf("timeline:\n%s\nwant the attempts between the crash and the takeover to be 409s, in flight", formatRows(rows))
			break
		}
	}
	// The page noticed the server going away and coming back, and the
	// crash hint says what happened instead of "Armed".
	waitPage(t, ctx, `document.getElementById("server-status").textContent.includes("restarted")`)
	waitPage(t, ctx, `document.getElementById("demo-hint").textContent.startsWith("The server was killed after processor call")`)
	// The key record says the operation was taken over: its first owner died.
	waitPage(t, ctx, `[...document.querySelectorAll("#record dt")].some(dt => dt.textContent === "attempt" && dt.nextElementSibling.textContent === "2")`)
	waitPage(t, ctx, `document.querySelectorAll("#ledger tbody tr").length >= 1`)
	if n := pageText(t, ctx, `String(document.querySelectorAll("#ledger tbody tr").length)`); n != "1" {
		t.Errorf("the ledger shows %s effects; want 1", n)
	}
	// The story in pictures: the crashed attempt says it got no answer,
	// the takeover's sequence says so in one mark, and all of it is on
	// the first screen beside the controls.
	const traces = `[...document.querySelectorAll("#attempts tbody tr")].reverse().map(r => r.children[7].textContent)`
	waitPage(t, ctx, traces+`.slice(-1)[0].includes("took over from a dead owner")`)
	if got := pageText(t, ctx, traces+`[1]`); !strings.HasPrefix(got, "✕ no answer") {
		t.Errorf("the crashed attempt's trace %q; want it to say there was no answer", got)
	}
	storyInView(t, ctx, "after a crash and its takeover", true)

	// The terminal, meanwhile, with the page polling all along: the crash
	// and the restart each in a line, and little else.
	lines := commandLogs.of(cmd)
	text := strings.Join(lines, "\n")
	for _, want := range []string{"faults: crashing the server on purpose", "demo: the server exited; starting it again"} {
		if !strings.Contains(text, want) {
			t.Errorf("the terminal lacks %q:\n%s", want, text)
		}
	}
	t.Logf("the terminal: %d lines", len(lines))
	if len(lines) >= 20 {
		t.Errorf("the terminal got %d lines in this session; want fewer than 20:\n%s", len(lines), text)
	}
}

// Each kind of operation keeps its own key. A charge that has no final
// answer yet (the processor is down) keeps its key; a payout started
// meanwhile goes out under a key of its own (never the charge's, which
// would be a 422); charging the same order again later is a retry under
// the pending key, which resumes it; and once it is final, the next charge
// gets a fresh key.
func TestDemoPageOperationsHaveTheirOwnKeys(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	createOrderOnPage(t, ctx)

	ts.setChaos(t, fakeprocessor.Chaos{ErrorRate: 1})
	click(t, ctx, "charge")
	waitPage(t, ctx, attemptStatuses+`[0] === "503 processor_unavailable"`)
	// The charge is still retrying (5 attempts, a second apart as
	// Retry-After says). Pay out now.
	click(t, ctx, "payout")
	waitPage(t, ctx, `document.getElementById("payout-status").textContent === "refused: insufficient_balance"`)
	// The charge's retries run out without a final answer.
	waitPage(t, ctx, `[...document.querySelectorAll("#attempts tbody tr")].filter(r => r.children[1].textContent.endsWith("/charges")).length === 5`)
	waitPage(t, ctx, `document.querySelector("#attempts tbody tr").children[5].textContent !== ""`)

	rows := readAttempts(t, ctx)
	var chargeKey, payoutKey string
	for _, r := range rows {
		switch {
		case strings.HasSuffix(r.request, "/charges"):
			if chargeKey == "" {
				chargeKey = r.key
			} else if r.key != chargeKey {
				t.Errorf("timeline:\n%s\nwant one key for every attempt of the charge", formatRows(rows))
			}
		case r.request == "POST /v1/payouts":
			payoutKey = r.key
			if !strings.HasPrefix(r.status, "409 insufficient_balance") || r.outcome != "new" {
				t.Errorf("timeline:\n%s\nwant the payout refused for the balance, as a new operation", formatRows(rows))
			}
		}
	}
	if chargeKey == "" || payoutKey == "" || payoutKey == chargeKey {
		t.Fatalf("timeline:\n%s\nwant the payout under a key of its own, not the pending charge's", formatRows(rows))
	}
	if got := pageText(t, ctx, `document.getElementById("charge-key").value`); got != chargeKey {
		t.Errorf("charge key field %q; want the pending charge's %q", got, chargeKey)
	}

	// The processor is back: charging the order again is the same
	// operation, retried under its key, and it resumes.
	ts.setChaos(t, fakeprocessor.Chaos{})
	click(t, ctx, "charge")
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
	rows = readAttempts(t, ctx)
	if last := rows[len(rows)-1]; last.key != chargeKey || last.outcome != "resumed" {
		t.Errorf("timeline:\n%s\nwant the charge resumed under its pending key", formatRows(rows))
	}

	// Final now: the next charge (of a new order) has a fresh key.
	createOrderOnPage(t, ctx)
	click(t, ctx, "charge")
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
	rows = readAttempts(t, ctx)
	if last := rows[len(rows)-1]; last.key == chargeKey || last.outcome != "new" {
		t.Errorf("timeline:\n%s\nwant the second charge under a fresh key", formatRows(rows))
	}
	if n := len(ts.effects(t)); n != 2 {
		t.Errorf("%d processor effects; want 2 (one per charge)", n)
	}
}

// A key whose operation has no final answer survives a reload; once the
// operation is final, the next one gets a fresh key.
func TestDemoPageKeepsThePendingKey(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	const keyValue = `document.getElementById("order-key").value`
	pending := pageText(t, ctx, keyValue)
	if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, `document.getElementById("server-status").textContent === "server: up"`)
	if after := pageText(t, ctx, keyValue); after != pending || after == "" {
		t.Fatalf("key %q after a reload; want the pending %q", after, pending)
	}
	createOrderOnPage(t, ctx)
	click(t, ctx, "create-order")
	waitPage(t, ctx, `document.querySelectorAll("#attempts tbody tr").length === 2`)
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
	rows := readAttempts(t, ctx)
	if rows[0].key != pending || rows[1].key == pending || rows[0].outcome != "new" || rows[1].outcome != "new" {
		t.Errorf("timeline:\n%s\nwant the pending key %s used first, and a fresh key for the next order", formatRows(rows), pending)
	}
	if n := ts.count(t, "orders"); n != 2 {
		t.Errorf("%d orders; want 2", n)
	}
}

// Processor chaos set from the page can be turned off from it: Chaos off
// puts every rate and the latency back to 0, on the page and at the
// processor.
func TestDemoPageTurnsChaosOff(t *testing.T) {
	t.Parallel()
	dbURL := testdb.New(t)
	addr, _ := startCommand(t, "cmd/server", []string{"demo"}, "DATABASE_URL="+dbURL, "HTTP_ADDR=127.0.0.1:0", "RECONCILER_ENABLED=false")
	ctx := browser(t, "http://"+addr, 1280, 1000)
	waitPage(t, ctx, `!document.getElementById("chaos").disabled`)
	chaos := func() fakeprocessor.Chaos {
		t.Helper()
		res, err := http.Get("http://" + addr + "/demo/chaos")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var c fakeprocessor.Chaos
		if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}

	for id, v := range map[string]string{"error-rate": "0.5", "latency": "100"} {
		if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID(id), v)); err != nil {
			t.Fatal(err)
		}
	}
	click(t, ctx, "apply-chaos")
	waitPage(t, ctx, `document.getElementById("demo-hint").textContent.startsWith("Processor chaos set")`)
	if c := chaos(); c.ErrorRate != 0.5 || c.LatencyMS != 100 {
		t.Fatalf("after Apply chaos the processor has %+v; want an error rate of 0.5 and 100 ms", c)
	}
	click(t, ctx, "chaos-off")
	waitPage(t, ctx, `document.getElementById("demo-hint").textContent.startsWith("Processor chaos off")`)
	if c := chaos(); c.ErrorRate != 0 || c.LatencyMS != 0 || c.TimeoutRate != 0 {
		t.Errorf("after Chaos off the processor has %+v; want no chaos", c)
	}
	if v := pageText(t, ctx, `["error-rate", "latency", "lost-rate"].map(id => document.getElementById(id).value).join(",")`); v != "0,0,0" {
		t.Errorf("after Chaos off the page's fields say %s; want 0,0,0", v)
	}
}
