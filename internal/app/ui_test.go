package app

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

// These tests drive the demo page in a real headless Chromium against the
// real server (demo mode on), and check what they see through the API and
// the processor's ledger, not only on the page.

// chromium finds a Chromium or Chrome binary: CHROME_PATH, or the usual
// names on the PATH.
func chromium() string {
	if p := os.Getenv("CHROME_PATH"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser opens a tab on the demo page at url and waits for it to find the
// server up. See newTab.
func browser(t *testing.T, url string, width, height int) context.Context {
	t.Helper()
	ctx := newTab(t, url, width, height)
	waitPage(t, ctx, `document.getElementById("server-status").textContent === "server: up"`)
	return ctx
}

// theBrowser is one headless Chromium for all the package's tests, started
// by the first that needs it: each test opens tabs of its own in it
// (newTab), which costs far less CPU than a browser each. TestMain stops
// it (closeBrowser), and Linux kills it with the test binary if need be.
var theBrowser = sync.OnceValues(func() (context.Context, error) {
	path := chromium()
	if path == "" {
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "chromium-")
	if err != nil {
		return nil, err
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.UserDataDir(dir),
	)
	allocCtx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	closeBrowser = func() { cancel(); _ = os.RemoveAll(dir) }
	ctx, _ := chromedp.NewContext(allocCtx)
	return ctx, chromedp.Do(ctx, chromedp.Navigate("about:blank")) // starts it
})

// closeBrowser stops theBrowser, if it started, and removes its profile.
var closeBrowser = func() {}

// newTab opens a tab on the page at url, its viewport width × height.
// Console errors and uncaught exceptions on the page fail the test (a page
// asset that fails to load, too; an API answer with an error status does
// not). Without Chromium the test is skipped with a hint, except under CI,
// where it fails.
func newTab(t *testing.T, url string, width, height int) context.Context {
	t.Helper()
	browserCtx, err := theBrowser()
	switch {
	case err != nil:
		t.Fatalf("start Chromium: %v", err)
	case browserCtx == nil && os.Getenv("CI") != "":
		t.Fatal("the browser tests need Chromium, and CI must have it (.ci/run installs it)")
	case browserCtx == nil:
		t.Skip("no Chromium: install it (apt-get install -y chromium) or set CHROME_PATH to run the browser tests")
	}
	ctx, cancelTab := chromedp.NewContext(browserCtx)
	t.Cleanup(cancelTab)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)

	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	var (
		mu       sync.Mutex
		problems []string
	)
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError && m.Source == "network" && pageCall(m.URL) {
				// Chromium logs every API answer with an error status
				// (a 409, a 422, a 503) as a failed load, and every
				// call the demo's crash cut off (the page's polls of
				// /healthz and /demo too). Those are what the demo
				// shows, not faults of the page; any other failed load
				// (an asset of the page) is.
				continue
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String())
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("console: %s", p)
		}
	})
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// pageCall says whether url is one the page's script calls (the API, the
// demo's endpoints, the health check), rather than an asset of the page.
func pageCall(url string) bool {
	return strings.Contains(url, "/v1/") || strings.Contains(url, "/demo/") || strings.HasSuffix(url, "/healthz")
}

// waitPage waits until the JavaScript condition holds on the page. A poll
// that began while the page was still replacing about:blank can lose its
// JavaScript context ("Cannot find context with specified id"); it is
// asked again in the new one.
func waitPage(t *testing.T, ctx context.Context, condition string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](condition, chromedp.WithPollingTimeout(time.Until(deadline))))
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Cannot find context with specified id") || time.Now().After(deadline) {
			// The attempts so far (time, request, status, outcome, ...):
			// what the page saw, for whoever reads the failure.
			attempts, _ := chromedp.Run(context.WithoutCancel(ctx), chromedp.Evaluate[string](`document.querySelector("#attempts tbody")?.innerText ?? ""`))
			t.Fatalf("waiting for %s: %v\nthe page's attempts:\n%s", condition, err, attempts)
		}
	}
}

func click(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID(id))); err != nil {
		t.Fatalf("click #%s: %v", id, err)
	}
}

func pageText(t *testing.T, ctx context.Context, expr string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return s
}

// createOrderOnPage clicks Create order and waits for its 201 in the
// timeline.
func createOrderOnPage(t *testing.T, ctx context.Context) {
	t.Helper()
	click(t, ctx, "create-order")
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
}

// The statuses of the timeline's attempts, newest first.
const attemptStatuses = `[...document.querySelectorAll("#attempts tbody tr")].map(r => r.children[2].textContent)`

// Create an order, send it again with the same key: the second answer is
// the replay, marked as such, and one order exists.
func TestDemoPageReplay(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)

	createOrderOnPage(t, ctx)
	click(t, ctx, "send-again")
	waitPage(t, ctx, `document.querySelectorAll("#attempts tbody tr").length === 2`)
	waitPage(t, ctx, `document.querySelector("#attempts tbody tr").children[3].textContent === "replayed"`)
	if msg := pageText(t, ctx, `document.getElementById("break-result").textContent`); !strings.Contains(msg, "byte for byte") {
		t.Errorf("explanation %q", msg)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// The same key with a different body is a 422, explained.
func TestDemoPageSameKeyDifferentBody(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	createOrderOnPage(t, ctx)
	click(t, ctx, "different-body")
	waitPage(t, ctx, attemptStatuses+`[0] === "422 idempotency_key_reused"`)
	if msg := pageText(t, ctx, `document.getElementById("break-result").textContent`); !strings.Contains(msg, "422") {
		t.Errorf("explanation %q", msg)
	}
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders; want 1", n)
	}
}

// Five concurrent identical requests under one key create one order, and
// all five converge on its answer: the duplicates wait on the server for
// the original and get its response, replayed. The timeline shows one new
// answer and four replays, each marked.
func TestDemoPageSendFiveAtOnce(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	click(t, ctx, "send-five")
	waitPage(t, ctx, `document.getElementById("break-result").textContent.startsWith("5 requests")`)
	wantOneOriginalFourReplays(t, ctx)
	if n := ts.count(t, "orders"); n != 1 {
		t.Errorf("%d orders after 5 concurrent requests with one key; want exactly 1", n)
	}
}

// wantOneOriginalFourReplays checks the timeline after Send 5 at once: five
// 201s under one key, one of them new and four replayed, and the page's
// summary saying so.
func wantOneOriginalFourReplays(t *testing.T, ctx context.Context) {
	t.Helper()
	rows := readAttempts(t, ctx)
	if len(rows) < 5 {
		t.Fatalf("%d rows in the timeline; want at least the five", len(rows))
	}
	outcomes := map[string]int{}
	for _, r := range rows[len(rows)-5:] {
		if r.status != "201" || r.key != rows[len(rows)-1].key {
			t.Errorf("row %+v; want a 201 under the five's one key", r)
		}
		outcomes[r.outcome]++
	}
	if outcomes["new"] != 1 || outcomes["replayed"] != 4 {
		t.Errorf("outcomes %v; want one new and four replayed", outcomes)
	}
	if msg := pageText(t, ctx, `document.getElementById("break-result").textContent`); !strings.Contains(msg, "1 ran the") || !strings.Contains(msg, "4 got its replay") || !strings.Contains(msg, "0 were told 409") {
		t.Errorf("summary %q; want one original, four replays, no 409", msg)
	}
}

// After a charge, Send 5 at once charges a fresh order five times at once
// under one key: one charge exists, the processor made one, and the four
// duplicates got the original's answer, replayed.
func TestDemoPageSendFiveChargesAtOnce(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	createOrderOnPage(t, ctx)
	click(t, ctx, "charge")
	waitPage(t, ctx, `document.querySelectorAll("#attempts tbody tr").length === 2`)
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
	click(t, ctx, "send-five")
	waitPage(t, ctx, `document.getElementById("break-result").textContent.startsWith("5 requests")`)
	// It says the order is a new one: the button's name alone does not.
	if msg := pageText(t, ctx, `document.getElementById("break-result").textContent`); !strings.Contains(msg, "One charge exists") || !strings.Contains(msg, "of a new order") {
		t.Errorf("message %q; want it to say one charge exists, of a new order", msg)
	}
	wantOneOriginalFourReplays(t, ctx)
	var charges, ordersCharged int
	if err := ts.db.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT order_id) FROM charges`).Scan(&charges, &ordersCharged); err != nil {
		t.Fatal(err)
	}
	if charges != 2 || ordersCharged != 2 {
		t.Errorf("%d charges of %d orders; want 2 of 2 (the first charge, and one for the five requests)", charges, ordersCharged)
	}
	if n := len(ts.effects(t)); n != 2 {
		t.Errorf("%d processor effects; want 2", n)
	}
}

// pm_card_flaky: the page's client retries the 503s with the same key
// until the charge succeeds, and the processor charged the card once.
func TestDemoPageFlakyChargeRetriedToSuccess(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	createOrderOnPage(t, ctx)
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("payment-method"), "pm_card_flaky")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "charge")
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
	statuses := pageText(t, ctx, attemptStatuses+`.join(",")`)
	if n := strings.Count(statuses, "503"); n < 2 {
		t.Errorf("statuses %s; want the two 503s before the 201 to be visible", statuses)
	}
	n := 0
	for _, e := range ts.effects(t) {
		if e.Object == fakeprocessor.ObjectCharge {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d charges at the processor; want 1", n)
	}
	waitPage(t, ctx, `document.querySelectorAll("#ledger tbody tr").length === 1`)
	// Our side: the one charge's one entry, from the processor to available.
	waitPage(t, ctx, `document.querySelectorAll("#entries tbody tr").length === 1 &&
		document.querySelector("#entries tbody tr").textContent.includes("processor → available")`)
}

// A message appears beside the control it is about, and the next request
// clears it: no line outlives what it described.
func TestDemoPageStatusLinesDoNotGoStale(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 800)
	said := func(id string) string { return pageText(t, ctx, `document.getElementById("`+id+`").textContent`) }
	click(t, ctx, "charge")
	if got := said("charge-status"); got != "Create an order first." {
		t.Errorf("charging with no order: the charge form says %q", got)
	}
	click(t, ctx, "send-again")
	if got, old := said("break-result"), said("charge-status"); got != "Make a request first." || old != "" {
		t.Errorf("send again with nothing sent: %q beside it, and the charge form still says %q", got, old)
	}
	createOrderOnPage(t, ctx)
	if got := said("break-result"); got != "" {
		t.Errorf("after an order, the break section still says %q", got)
	}
}

// The demo page on a desktop (1280x800) and a phone (390x844), through the
// story: an order, its charge, a retry sent from the bottom of the
// controls, Send 5 at once, and on the desktop a charge retried after two
// 503s (the longest cells). After each step, cause and effect share the
// screen (storyInView). axe-core finds no serious or critical
// accessibility violation, on load and with the story filled. No word
// breaks in two: on the desktop no line of the attempts table or of the
// key record panel ends inside a word (a time, a key, an id, a status) or
// runs out of its cell, and on the phone the attempts table's headers each
// fit their own cell. With SCREENSHOTS set to a directory (make
// screenshots), it saves what each size shows after the charge: the
// README's picture.
func TestDemoPageAtBothSizes(t *testing.T) {
	t.Parallel()
	axe := npmTool(t, "axe-core", axeCorePath)
	for _, size := range []struct {
		name          string
		width, height int
	}{{"desktop", 1280, 800}, {"phone", 390, 844}} {
		ts := newTestServer(t, withDemo) // a ledger of this size's charge alone
		ctx := browser(t, ts.URL, size.width, size.height)
		desktop := size.name == "desktop"
		story := func(step string) {
			t.Helper()
			waitPage(t, ctx, `document.querySelector("#attempts tbody tr:first-child svg.sequence") !== null`)
			storyInView(t, ctx, size.name+", "+step, desktop)
		}
		if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](string(axe))); err != nil {
			t.Fatal(err)
		}
		accessible := func(when string) {
			t.Helper()
			result, err := chromedp.Run(ctx, chromedp.Evaluate[string](`axe.run(document, {resultTypes: ["violations"]}).then(r =>
				JSON.stringify(r.violations.filter(v => v.impact === "serious" || v.impact === "critical")
					.map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(" "))}))))`,
				chromedp.EvalAwaitPromise))
			if err != nil {
				t.Fatal(err)
			}
			if result != "[]" {
				t.Errorf("%s, %s: serious or critical accessibility violations: %s", size.name, when, result)
			}
		}
		accessible("on load")
		createOrderOnPage(t, ctx)
		waitPage(t, ctx, `document.querySelector("#record dd").textContent === "completed"`)
		story("after the order")
		click(t, ctx, "charge")
		waitPage(t, ctx, attemptStatuses+`[0] === "201" && document.querySelectorAll("#attempts tbody tr").length === 2`)
		waitPage(t, ctx, `document.querySelectorAll("#ledger tbody tr").length === 1`)
		story("after the charge")
		if dir := os.Getenv("SCREENSHOTS"); dir != "" {
			pageText(t, ctx, `window.scrollTo(0, 0); ""`)
			png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("demo-%s.png", size.name)), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// A retry from the bottom of the controls: its attempt shows
		// without scrolling back.
		pageText(t, ctx, `window.scrollTo(0, document.body.scrollHeight); document.getElementById("send-again").click(); ""`)
		waitPage(t, ctx, `document.querySelectorAll("#attempts tbody tr").length === 3`)
		story("after a retry sent from the bottom of the page")
		accessible("with the story filled")
		click(t, ctx, "send-five")
		waitPage(t, ctx, `document.getElementById("break-result").textContent.startsWith("5 requests")`)
		story("after Send 5 at once")

		if !desktop {
			if width := pageText(t, ctx, `String(window.innerWidth)`); width != "390" {
				t.Fatalf("the phone's viewport is %spx wide; want 390", width)
			}
			if overlaps := pageText(t, ctx, headersOverlap); overlaps != "" {
				t.Errorf("at 390x844, the attempts table's headers run into each other:\n%s", overlaps)
			}
			continue
		}
		// The longest cells: a charge retried after two 503s, each with
		// its problem's code, its Retry-After and its next try.
		createOrderOnPage(t, ctx)
		if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("payment-method"), "pm_card_flaky")); err != nil {
			t.Fatal(err)
		}
		click(t, ctx, "charge")
		waitPage(t, ctx, attemptStatuses+`.slice(0, 4).join() === "201,503 processor_unavailable,503 processor_unavailable,201"`)
		// Every attempt's sequence drawn, and the key record of the charge.
		waitPage(t, ctx, `[...document.querySelectorAll("#attempts tbody tr")].every(r => r.querySelector("svg.sequence"))`)
		waitPage(t, ctx, `document.querySelector("#record dd").textContent === "completed" && document.querySelectorAll("#points li").length === 3`)
		if broken := pageText(t, ctx, wordsBroken); broken != "" {
			t.Errorf("at 1280x800, words broken across lines (| marks the break):\n%s", broken)
		}
		// Nor is a word kept whole by running out of its cell.
		if over := pageText(t, ctx, overflowing); over != "" {
			t.Errorf("at 1280x800, text wider than its box:\n%s", over)
		}
	}
}

// storyInView fails the test if the page is wider than its window, or,
// when firstScreen, if the newest attempt, its sequence (once drawn) or
// the key record's and the ledger's headings are outside the viewport.
func storyInView(t *testing.T, ctx context.Context, step string, firstScreen bool) {
	t.Helper()
	overflow := pageText(t, ctx, `String(document.documentElement.scrollWidth - document.documentElement.clientWidth)`)
	if overflow != "0" {
		t.Errorf("%s: the page is %spx wider than the window", step, overflow)
	}
	if !firstScreen {
		return
	}
	for _, sel := range []string{"#attempts tbody tr", "#attempts tbody tr:first-child .trace", "#record-h", "#ledger-h"} {
		inView := `(() => { const e = document.querySelector("` + sel + `"); if (!e) return "true";
			const r = e.getBoundingClientRect(); return String(r.top >= 0 && r.top < window.innerHeight); })()`
		if pageText(t, ctx, inView) != "true" {
			t.Errorf("%s: %s is outside the first viewport", step, sel)
		}
	}
}

// wordsBroken lists, one a line, each place where a line of text in the
// attempts table or the key record panel breaks between two characters of
// a word: letters, digits, '_', and ':' or '.' between digits (a time, a
// number). A break at a space, or after '/', '-' or '→', is a line's end.
// Each character's line is the top of its box (a Range over it).
const wordsBroken = `(() => {
	const word = (s, i) => /[\p{L}\p{N}_]/u.test(s[i]) || (/[:.]/.test(s[i]) && /\d/.test(s[i - 1] ?? "") && /\d/.test(s[i + 1] ?? ""));
	const out = [];
	for (const root of document.querySelectorAll("#attempts, #record-panel")) {
		// The characters of each text, in order, across the texts of one
		// block (a cell, say), with a gap where one was not drawn.
		let last = null, gap = false, block = null;
		const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
		for (let n; (n = walk.nextNode()); ) {
			const el = n.parentElement;
			if (el.closest("svg")) continue; // its text is drawn, not laid out in lines
			let b = el;
			while (b !== root && getComputedStyle(b).display === "inline") b = b.parentElement;
			if (b !== block) { block = b; last = null; gap = false; }
			const s = n.data;
			for (let i = 0; i < s.length; i++) {
				const r = document.createRange();
				r.setStart(n, i);
				r.setEnd(n, i + 1);
				const box = [...r.getClientRects()].find((x) => x.width > 0);
				if (!box || /\s/.test(s[i])) { gap = true; continue; }
				const c = { box, isWord: word(s, i), at: s.slice(0, i) + "|" + s.slice(i) };
				if (last && !gap && box.top > last.box.top + last.box.height / 2 && last.isWord && c.isWord) {
					const cell = b.closest("td, th, dd, dt, li, output, p, h2") || b;
					out.push(cell.tagName.toLowerCase() + " in #" + (cell.closest("[id]")?.id ?? "") + ": " + JSON.stringify(c.at));
				}
				last = c;
				gap = false;
			}
		}
	}
	return out.join("\n");
})()`

// overflowing lists the cells of the attempts table and of the key record
// whose text is wider than the cell, and the attempts table if it is wider
// than its panel (it then scrolls sideways).
const overflowing = `(() => {
	const out = [];
	const scroll = document.querySelector("#attempts-panel .scroll");
	if (scroll.scrollWidth > scroll.clientWidth) out.push("#attempts is " + scroll.scrollWidth + "px wide in a panel of " + scroll.clientWidth + "px");
	for (const el of document.querySelectorAll("#attempts td, #attempts th, #record dt, #record dd, #points li")) {
		const r = el.getBoundingClientRect();
		if (r.width > 1 && el.scrollWidth > el.clientWidth) out.push(el.tagName.toLowerCase() + " " + JSON.stringify(el.textContent.slice(0, 80)) + " is " + el.scrollWidth + "px wide in " + el.clientWidth + "px");
	}
	return out.join("\n");
})()`

// headersOverlap lists the attempts table's headers whose text is wider
// than their cell, or whose text's box meets another header's. A header
// visually hidden (for screen readers only) has no box to speak of.
const headersOverlap = `(() => {
	const out = [];
	const heads = [...document.querySelectorAll("#attempts thead th")].filter((th) => {
		const r = th.getBoundingClientRect();
		return r.width > 1 && r.height > 1;
	});
	const text = (th) => { const r = document.createRange(); r.selectNodeContents(th); return [...r.getClientRects()]; };
	for (const th of heads) {
		if (th.scrollWidth > th.clientWidth) out.push(JSON.stringify(th.textContent) + " is " + th.scrollWidth + "px wide in a cell of " + th.clientWidth + "px");
	}
	for (const [i, a] of heads.entries()) {
		for (const b of heads.slice(i + 1)) {
			const meet = text(a).some((x) => text(b).some((y) => x.left < y.right && y.left < x.right && x.top < y.bottom && y.top < x.bottom));
			if (meet) out.push(JSON.stringify(a.textContent) + " runs into " + JSON.stringify(b.textContent));
		}
	}
	return out.join("\n");
})()`

// npmTool reads the script at path, a tool make check-tools installs under
// .cache/: without it the test is skipped with a hint, except under CI,
// where it fails.
func npmTool(t *testing.T, name, path string) []byte {
	t.Helper()
	script, err := os.ReadFile(path)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is needed under CI (.ci/run installs it): %v", name, err)
		}
		t.Skipf("no %s (%v): run 'make check-tools' to install it", name, err)
	}
	return script
}

// axeCore is the axe-core accessibility engine, installed from the npm
// registry at a pinned version by `make check-tools` (.ci/run does it) under .cache/.
const axeCorePath = "../../.cache/npm/node_modules/axe-core/axe.min.js"

// Every link on the page leads somewhere: the docs it points to are served
// from the binary, and nothing is fetched from elsewhere.
func TestDemoPageLinksResolve(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	links := pageText(t, ctx, `[...document.querySelectorAll("a[href]")].map(a => a.getAttribute("href")).join(" ")`)
	if links == "" {
		t.Fatal("no links on the page")
	}
	for href := range strings.FieldsSeq(links) {
		if !strings.HasPrefix(href, "/") {
			t.Errorf("link %q leaves the server", href)
			continue
		}
		if res := ts.do(t, request{method: "GET", path: href}); res.Status != http.StatusOK {
			t.Errorf("link %s: %d", href, res.Status)
		}
	}
}

// A payout from the page: 202 Accepted, then the page polls the payout as
// Retry-After says and shows it move to paid; the processor made one
// transfer.
func TestDemoPagePayoutIsFollowedToPaid(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ts.fund(t, "sk_test_acme", 3000)
	ctx := browser(t, ts.URL, 1280, 1000)
	waitPage(t, ctx, `document.getElementById("balance").textContent === "3000 usd available, 0 pending"`)

	click(t, ctx, "payout")
	waitPage(t, ctx, `document.getElementById("payout-status").textContent === "paid"`)
	rows := pageText(t, ctx, `[...document.querySelectorAll("#attempts tbody tr")].map(r => r.children[1].textContent + " " + r.children[2].textContent + " " + r.children[4].textContent).join("\n")`)
	if !strings.Contains(rows, "POST /v1/payouts 202") || !strings.Contains(rows, "GET /v1/payouts/po_") {
		t.Errorf("timeline:\n%s\nwant the 202 and the polls", rows)
	}
	if current := pageText(t, ctx, `document.querySelector("#payout-states [aria-current]").textContent`); current != "paid or failed" {
		t.Errorf("current state %q", current)
	}
	waitPage(t, ctx, `document.getElementById("balance").textContent === "2000 usd available, 0 pending"`)
	if tr := ts.payoutTransfers(t); len(tr) != 1 || tr[0].Status != "paid" {
		t.Errorf("processor payouts %+v; want one paid", tr)
	}
}

// /docs renders the served contract with the embedded Redoc, and the page
// loads nothing from any other host (it works offline).
func TestAPIReferenceRendersOffline(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ctx := newTab(t, ts.URL+"/docs", 1280, 1000)
	// Redoc has read the spec: the operations' summaries are on the page.
	waitPage(t, ctx, `document.body.innerText.includes("Pay out to a bank account") && document.body.innerText.includes("Charge an order")`)
	loaded := pageText(t, ctx, `performance.getEntriesByType("resource").map(e => e.name).concat([location.href]).join("\n")`)
	for u := range strings.SplitSeq(loaded, "\n") {
		if !strings.HasPrefix(u, ts.URL+"/") {
			t.Errorf("the reference loaded %s, from another host", u)
		}
	}
	if !strings.Contains(loaded, ts.URL+"/openapi.yaml") || !strings.Contains(loaded, ts.URL+"/docs/redoc.standalone.js") {
		t.Errorf("loaded:\n%s\nwant the spec and the embedded Redoc", loaded)
	}
}
