package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgconn"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/idempotency"
)

// The process's tracing, set up once for every test of the package, as
// cmd/server sets it up in DEMO_MODE (so that the demo's store exists),
// with one more processor: watched, which hands each test the spans of
// the traces it started, and only those (tests run in parallel, and all
// of their servers share the one global provider).
var (
	tracingOnce sync.Once
	tracing     *Tracing
	tracingErr  error
	// tracingInstalled is whether the provider is in place, for servers
	// built by other tests meanwhile.
	tracingInstalled atomic.Bool
	watched          = &traceWatch{recorders: map[trace.TraceID]*tracetest.SpanRecorder{}}
)

func testTracing(t testing.TB) *Tracing {
	t.Helper()
	tracingOnce.Do(func() {
		tracing, tracingErr = SetupTracing(context.Background(), true, watched)
		tracingInstalled.Store(tracingErr == nil)
	})
	if tracingErr != nil {
		t.Fatal(tracingErr)
	}
	return tracing
}

// traceWatch forwards the spans of watched traces (or of traces linked to
// one) to that trace's tracetest.SpanRecorder, the SDK's in-memory
// exporter for tests.
type traceWatch struct {
	mu        sync.Mutex
	recorders map[trace.TraceID]*tracetest.SpanRecorder
}

func (w *traceWatch) recorderOf(s sdktrace.ReadOnlySpan) *tracetest.SpanRecorder {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r, ok := w.recorders[s.SpanContext().TraceID()]; ok {
		return r
	}
	for _, l := range s.Links() {
		if r, ok := w.recorders[l.SpanContext.TraceID()]; ok {
			return r
		}
	}
	return nil
}

// OnStart watches the trace of a span linked to a watched trace (a
// background job's): its children end before it does, so it is watched
// from its start.
func (w *traceWatch) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range s.Links() {
		if r, ok := w.recorders[l.SpanContext.TraceID()]; ok {
			w.recorders[s.SpanContext().TraceID()] = r
		}
	}
}
func (w *traceWatch) OnEnd(s sdktrace.ReadOnlySpan) {
	if r := w.recorderOf(s); r != nil {
		r.OnEnd(s)
	}
}
func (w *traceWatch) Shutdown(context.Context) error   { return nil }
func (w *traceWatch) ForceFlush(context.Context) error { return nil }

// newTrace starts a trace of the test's own, as a client that traces
// would, and returns its traceparent header (sampled) and a recorder of
// its spans.
func newTrace(t testing.TB) (traceparent string, id trace.TraceID, rec *tracetest.SpanRecorder) {
	t.Helper()
	testTracing(t)
	var span [8]byte
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(span[:])
	rec = tracetest.NewSpanRecorder()
	watched.mu.Lock()
	watched.recorders[id] = rec
	watched.mu.Unlock()
	t.Cleanup(func() {
		watched.mu.Lock()
		defer watched.mu.Unlock()
		for k, r := range watched.recorders {
			if r == rec {
				delete(watched.recorders, k)
			}
		}
	})
	return fmt.Sprintf("00-%s-%s-01", id, hex.EncodeToString(span[:])), id, rec
}

// traced is r sent as part of the trace traceparent names.
func traced(r request, traceparent string) request {
	h := http.Header{}
	for k, v := range r.header {
		h[k] = v
	}
	h.Set("traceparent", traceparent)
	r.header = h
	return r
}

// spanTree is a trace's spans by name, for the assertions: each name's
// spans, in the order they ended.
type spanTree []sdktrace.ReadOnlySpan

// waitForSpans waits until rec holds a span named root, the request's
// span, which ends last (just after the answer is written: the client
// may see the answer first).
func waitForSpans(t testing.TB, rec *tracetest.SpanRecorder, root string) spanTree {
	t.Helper()
	var spans spanTree
	waitFor(t, 5*time.Second, "the request's span "+root+" to end", func() bool {
		spans = rec.Ended()
		return len(spans.named(root)) > 0
	})
	return spans
}

func (s spanTree) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, span := range s {
		if span.Name() == name {
			out = append(out, span)
		}
	}
	return out
}

// one is the one span named name, failing the test if there is not
// exactly one.
func (s spanTree) one(t testing.TB, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := s.named(name)
	if len(got) != 1 {
		t.Fatalf("%d spans named %q; want 1. The trace: %s", len(got), name, s)
	}
	return got[0]
}

func (s spanTree) String() string {
	var b bytes.Buffer
	for _, span := range s {
		fmt.Fprintf(&b, "\n  %s (%s, parent %s) %v", span.Name(), span.SpanContext().SpanID(), span.Parent().SpanID(), span.Attributes())
	}
	return b.String()
}

func attr(span sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range span.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func wantChild(t testing.TB, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %q's parent is %s; want %q (%s)", child.Name(), child.Parent().SpanID(), parent.Name(), parent.SpanContext().SpanID())
	}
}

func wantAttrs(t testing.TB, span sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := attr(span, k); got != v {
			t.Errorf("span %q: %s = %q; want %q", span.Name(), k, got, v)
		}
	}
}

// A client's traceparent is continued: the request's span is a child of
// the client's span, in its trace, and the request's log line names the
// same trace and the request's own span.
func TestTraceparentIsContinuedAndLogged(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ts := newTestServer(t, func(o *serverOptions) { o.logs = &logs })
	tp, id, rec := newTrace(t)
	key := "traced-" + rand.Text()
	res := ts.do(t, traced(ordersRequest(key, teaOrder), tp))
	if res.Status != http.StatusCreated {
		t.Fatalf("create order: %d %s", res.Status, res.Body)
	}
	spans := waitForSpans(t, rec, "POST /v1/orders")
	root := spans.one(t, "POST /v1/orders")
	if root.Parent().TraceID() != id || root.Parent().SpanID().String() != tp[36:52] || !root.Parent().IsRemote() {
		t.Errorf("the request's span's parent is %v; want the client's span %s", root.Parent(), tp[36:52])
	}
	wantAttrs(t, root, map[string]string{"http.route": "/v1/orders", "http.response.status_code": "201"})
	claim := spans.one(t, "idempotency.claim")
	wantChild(t, claim, root)
	wantAttrs(t, claim, map[string]string{
		"idempotency.outcome": "new", "idempotency.attempt": "1", "idempotency.operation": "createOrder",
		"idempotency.key_hash": idempotency.KeyHash("acme", key),
	})
	wantChild(t, spans.one(t, "phase started"), root)
	for _, span := range spans {
		for _, kv := range span.Attributes() {
			if bytes.Contains([]byte(kv.Value.String()), []byte(key)) {
				t.Errorf("span %q carries the Idempotency-Key in clear: %s", span.Name(), kv)
			}
		}
	}

	// The request's log line.
	var line map[string]any
	sc := bufio.NewScanner(bytes.NewReader([]byte(logs.String())))
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil && l["msg"] == "request" && l["key_hash"] == idempotency.KeyHash("acme", key) {
			line = l
		}
	}
	if line == nil {
		t.Fatalf("no request log line for the key in:\n%s", logs.String())
	}
	if line["trace_id"] != id.String() || line["span_id"] != root.SpanContext().SpanID().String() {
		t.Errorf("the request's log line names trace %v span %v; want %s %s", line["trace_id"], line["span_id"], id, root.SpanContext().SpanID())
	}
}

// root is the request's span: the one whose parent is the client's.
func (s spanTree) root(t testing.TB) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, span := range s {
		if span.Parent().IsRemote() && span.SpanKind() == trace.SpanKindServer && span.Name() != "fake processor POST /v1/charges" {
			return span
		}
	}
	t.Fatalf("no request span in the trace: %s", s)
	return nil
}

const chargeRoute = "POST /v1/orders/:order_id/charges"

// tracedCharge sends one charge attempt in a trace of its own and returns
// the answer and the trace's spans, once the request's span has ended.
func tracedCharge(t *testing.T, ts *testServer, orderID, key, pm string) (response, spanTree) {
	t.Helper()
	tp, _, rec := newTrace(t)
	res := ts.do(t, traced(chargeRequest(orderID, key, pm), tp))
	return res, waitForSpans(t, rec, chargeRoute)
}

// The span tree of a new charge: the claim (new, attempt 1), the first
// phase, the processor call (and, inside it, the fake processor's own
// span: it continued the trace), then the final phase; all under the
// request's span.
func TestTraceOfANewCharge(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1500)
	res, spans := tracedCharge(t, ts, o.ID, "traced-charge", "pm_card_visa")
	if res.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", res.Status, res.Body)
	}
	root := spans.root(t)
	claim, first, call, final := spans.one(t, "idempotency.claim"), spans.one(t, "phase started"),
		spans.one(t, "processor charges"), spans.one(t, "phase charge_created")
	for _, s := range []sdktrace.ReadOnlySpan{claim, first, call, final} {
		wantChild(t, s, root)
	}
	wantAttrs(t, claim, map[string]string{"idempotency.outcome": "new", "idempotency.attempt": "1", "idempotency.recovery_point": "started"})
	wantAttrs(t, first, map[string]string{"idempotency.attempt": "1", "idempotency.reached_point": "charge_created"})
	wantAttrs(t, final, map[string]string{"idempotency.attempt": "1", "idempotency.reached_point": "finished"})
	var downstream string
	if err := ts.db.QueryRow(context.Background(), `SELECT downstream_key FROM charges WHERE order_id = $1`, o.ID).Scan(&downstream); err != nil {
		t.Fatal(err)
	}
	wantAttrs(t, call, map[string]string{"processor.outcome": "definite", "processor.downstream_key": downstream})
	wantChild(t, spans.one(t, "fake processor POST /v1/charges"), call)
	// In the order they ran.
	if !(claim.EndTime().Compare(first.StartTime()) <= 0 && first.EndTime().Compare(call.StartTime()) <= 0 && call.EndTime().Compare(final.StartTime()) <= 0) {
		t.Errorf("the spans are out of order: %s", spans)
	}
}

// A replay is a claim and nothing else: no phase, no processor call.
func TestTraceOfAReplay(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1500)
	if res, _ := tracedCharge(t, ts, o.ID, "traced-replay", "pm_card_visa"); res.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", res.Status, res.Body)
	}
	res, spans := tracedCharge(t, ts, o.ID, "traced-replay", "pm_card_visa")
	if res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry was not replayed: %d %v", res.Status, res.Header)
	}
	wantChild(t, spans.one(t, "idempotency.claim"), spans.root(t))
	wantAttrs(t, spans.one(t, "idempotency.claim"), map[string]string{"idempotency.outcome": "replayed"})
	for _, s := range spans {
		if s.Name() != "idempotency.claim" && s.Name() != chargeRoute {
			t.Errorf("a replay made the span %q; want only the request's and the claim", s.Name())
		}
	}
}

// A charge whose processor call got no definite answer is resumed by the
// client's retry: the retry's trace has no first phase (it committed in
// an earlier attempt), but the processor call, under the same downstream
// key, and the final phase; its claim says resumed, at a later attempt,
// from charge_created. The failed attempt's trace shows why: its call was
// uncertain, and it ran no final phase.
func TestTraceOfAResumedCharge(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1500)
	// pm_card_flaky: the processor fails the first two calls (503).
	res, spans := tracedCharge(t, ts, o.ID, "traced-resumed", "pm_card_flaky")
	if res.Status != http.StatusServiceUnavailable {
		t.Fatalf("first attempt: %d %s; want the flaky card's 503", res.Status, res.Body)
	}
	spans.one(t, "phase started")
	wantAttrs(t, spans.one(t, "processor charges"), map[string]string{"processor.outcome": "uncertain"})
	if n := len(spans.named("phase charge_created")); n != 0 {
		t.Errorf("the uncertain attempt ran the final phase: %s", spans)
	}
	downstream := attr(spans.one(t, "processor charges"), "processor.downstream_key")

	for attempt := 2; ; attempt++ {
		res, spans = tracedCharge(t, ts, o.ID, "traced-resumed", "pm_card_flaky")
		claim := spans.one(t, "idempotency.claim")
		wantAttrs(t, claim, map[string]string{"idempotency.outcome": "resumed", "idempotency.attempt": fmt.Sprint(attempt),
			"idempotency.recovery_point": "charge_created"})
		if n := len(spans.named("phase started")); n != 0 {
			t.Errorf("attempt %d ran the first phase again: %s", attempt, spans)
		}
		wantAttrs(t, spans.one(t, "processor charges"), map[string]string{"processor.downstream_key": downstream})
		if res.Status == http.StatusCreated {
			wantAttrs(t, spans.one(t, "phase charge_created"), map[string]string{
				"idempotency.attempt": fmt.Sprint(attempt), "idempotency.reached_point": "finished"})
			wantAttrs(t, spans.one(t, "processor charges"), map[string]string{"processor.outcome": "definite"})
			break
		}
		if attempt == 5 {
			t.Fatalf("attempt %d: %d %s; the flaky card should have passed", attempt, res.Status, res.Body)
		}
	}
}

// In the demo, GET /demo/traces shows a charge's spans, with their
// parents, timings and attributes, for the page's waterfall.
func TestDemoTracesShowsACharge(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	o := ts.newOrder(t, "sk_test_acme", 1500)
	tp, id, rec := newTrace(t)
	if res := ts.do(t, traced(chargeRequest(o.ID, "demo-traced", "pm_card_visa"), tp)); res.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", res.Status, res.Body)
	}
	waitForSpans(t, rec, chargeRoute)
	var got struct {
		TraceID string `json:"trace_id"`
		Spans   []struct {
			Name       string         `json:"name"`
			SpanID     string         `json:"span_id"`
			Parent     string         `json:"parent_span_id"`
			Start      time.Time      `json:"start"`
			End        time.Time      `json:"end"`
			Attributes map[string]any `json:"attributes"`
		} `json:"spans"`
	}
	res := ts.get(t, "/demo/traces?trace_id="+id.String())
	if res.Status != http.StatusOK {
		t.Fatalf("/demo/traces: %d %s", res.Status, res.Body)
	}
	res.decode(t, &got)
	byName := map[string]string{}
	ids := map[string]string{}
	for _, s := range got.Spans {
		byName[s.Name] = s.Parent
		ids[s.SpanID] = s.Name
		if s.Start.IsZero() {
			t.Errorf("span %q has no start", s.Name)
		}
	}
	for name, parent := range map[string]string{
		"idempotency.claim": chargeRoute, "phase started": chargeRoute, "processor charges": chargeRoute,
		"phase charge_created": chargeRoute, "fake processor POST /v1/charges": "processor charges",
	} {
		if p, ok := byName[name]; !ok || ids[p] != parent {
			t.Errorf("/demo/traces: span %q has parent %q; want %q. Got %s", name, ids[p], parent, res.Body)
		}
	}
	for _, q := range []string{"?trace_id=" + hex.EncodeToString(make([]byte, 16)), "?trace_id=nonsense", ""} {
		if res := ts.get(t, "/demo/traces"+q); res.Status != http.StatusNotFound {
			t.Errorf("/demo/traces%s: %d; want 404", q, res.Status)
		}
	}
}

// The demo's store is bounded: clients choose their trace ids, so it keeps
// the latest traces only, and the first spans of each.
func TestRecentTracesAreBounded(t *testing.T) {
	t.Parallel()
	r := NewRecentTraces(2, 3)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r))
	tracer := tp.Tracer("test")
	var ids []string
	for range 3 {
		ctx, root := tracer.Start(context.Background(), "root")
		for range 5 {
			_, s := tracer.Start(ctx, "child")
			s.End()
		}
		root.End()
		ids = append(ids, root.SpanContext().TraceID().String())
	}
	if _, ok := r.Trace(ids[0]); ok {
		t.Errorf("the oldest trace is still kept; want only the last 2")
	}
	for _, id := range ids[1:] {
		if spans, ok := r.Trace(id); !ok || len(spans) != 3 {
			t.Errorf("trace %s: %d spans, %v; want the first 3", id, len(spans), ok)
		}
	}
}

// The demo page draws each attempt's trace beside it: for a flaky card,
// the first attempt's waterfall has the first phase and an uncertain
// processor call, and the attempt that succeeds has no first phase (an
// earlier attempt committed it), a resumed claim, the call and the final
// phase.
func TestDemoPageDrawsEachAttemptAsASequence(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, withDemo)
	ctx := browser(t, ts.URL, 1280, 1000)
	createOrderOnPage(t, ctx)
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("payment-method"), "pm_card_flaky")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "charge")
	waitPage(t, ctx, attemptStatuses+`[0] === "201"`)
	const sequences = `[...document.querySelectorAll("#attempts tbody tr")].filter(r => r.children[1].textContent.endsWith("/charges")).map(r => r.children[7].textContent)`
	waitPage(t, ctx, sequences+`.every(w => w.includes("PostgreSQL"))`)
	got := pageText(t, ctx, sequences+`.reverse().join("\n")`)
	attempts := strings.Split(got, "\n")
	if len(attempts) < 3 {
		t.Fatalf("the charge's sequences: %q; want three attempts", got)
	}
	first, last := attempts[0], attempts[len(attempts)-1]
	for _, want := range []string{"claimed the key, attempt 1", "started → charge_created", "call charges under ", ": uncertain"} {
		if !strings.Contains(first, want) {
			t.Errorf("the first attempt's sequence %q lacks %q", first, want)
		}
	}
	for _, want := range []string{"resumed, attempt ", ": definite", "the processor's side: POST /v1/charges", "charge_created → finished"} {
		if !strings.Contains(last, want) {
			t.Errorf("the last attempt's sequence %q lacks %q", last, want)
		}
	}
	if strings.Contains(last, "started →") {
		t.Errorf("the last attempt's sequence %q ran the first phase again", last)
	}
	if strings.Contains(got, "?") {
		t.Errorf("the sequences %q hold a \"?\": every mark says what it was", got)
	}
	// The last attempt's drawing: the server's handling, the claim, the
	// call, the processor's side and the final phase, each on its lane.
	if n := pageText(t, ctx, `String(document.querySelector("#attempts tbody tr").querySelectorAll("svg.sequence rect").length)`); n != "5" {
		t.Errorf("the last attempt's sequence has %s marks (%s); want 5", n, last)
	}
}

// A payout's job runs in a trace of its own, linked to the request that
// accepted the payout (to the phase that enqueued it): the job's span is
// a root, its processor call a child of it, and the link leads back.
func TestTraceOfAPayoutJobIsLinkedToItsRequest(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.fund(t, "sk_test_acme", 5000)
	tp, id, rec := newTrace(t)
	res := ts.do(t, traced(payoutRequest("sk_test_acme", "traced-payout", `{"amount":1500,"currency":"usd","destination":"ba_test_ok"}`), tp))
	if res.Status != http.StatusAccepted {
		t.Fatalf("payout: %d %s", res.Status, res.Body)
	}
	var spans spanTree
	waitFor(t, 20*time.Second, "the payout job's first run, with its processor call", func() bool {
		spans = rec.Ended()
		return len(spans.named("payout job")) > 0 && len(spans.named("processor payouts")) > 0 && len(spans.named("POST /v1/payouts")) > 0
	})
	phase := spans.one(t, "phase started")
	if phase.SpanContext().TraceID() != id {
		t.Fatalf("the payout's phase is in trace %s; want the request's %s", phase.SpanContext().TraceID(), id)
	}
	job := spans.named("payout job")[0]
	if job.SpanContext().TraceID() == id || job.Parent().IsValid() {
		t.Errorf("the job's span is in trace %s with parent %v; want a root of a trace of its own", job.SpanContext().TraceID(), job.Parent())
	}
	if links := job.Links(); len(links) != 1 || links[0].SpanContext.TraceID() != id || links[0].SpanContext.SpanID() != phase.SpanContext().SpanID() {
		t.Errorf("the job's links %+v; want one, to the request's phase %s", links, phase.SpanContext().SpanID())
	}
	call := spans.named("processor payouts")[0]
	wantChild(t, call, job)
	wantAttrs(t, call, map[string]string{"processor.downstream_key": ts.payoutDownstreamKey(t, attr(job, "payout.id"))})
}

// wantLinkedRoot checks that span is the root of a trace of its own,
// linked once, to the span want of trace id.
func wantLinkedRoot(t testing.TB, span, want sdktrace.ReadOnlySpan, id trace.TraceID) {
	t.Helper()
	if span.SpanContext().TraceID() == id || span.Parent().IsValid() {
		t.Errorf("span %q is in trace %s with parent %v; want a root of a trace of its own", span.Name(), span.SpanContext().TraceID(), span.Parent())
	}
	if links := span.Links(); len(links) != 1 || links[0].SpanContext.TraceID() != id || links[0].SpanContext.SpanID() != want.SpanContext().SpanID() {
		t.Errorf("span %q's links %+v; want one, to %q %s of trace %s", span.Name(), links, want.Name(), want.SpanContext().SpanID(), id)
	}
}

// The reconciler resumes a charge its client left (the flaky card's 503,
// and no retry): its trace is its own, and links to the request that
// claimed the key, whose traceparent the claim stored. Without the link
// the resumption's spans would not even reach the test's recorder, which
// follows links from the request's trace.
func TestTraceOfAReconcilerResumeIsLinkedToItsRequest(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	o := ts.newOrder(t, "sk_test_acme", 1500)
	tp, id, rec := newTrace(t)
	res := ts.do(t, traced(chargeRequest(o.ID, "traced-reconciled", "pm_card_flaky"), tp))
	if res.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge: %d %s; want the flaky card's 503", res.Status, res.Body)
	}
	request := waitForSpans(t, rec, chargeRoute).root(t)
	var stored string
	if err := ts.db.QueryRow(context.Background(),
		`SELECT traceparent FROM idempotency_keys WHERE key = 'traced-reconciled'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("00-%s-%s-01", id, request.SpanContext().SpanID()); stored != want {
		t.Errorf("the record's traceparent is %q; want the request span's %q", stored, want)
	}
	// The client does not come back: make the record due for the
	// reconciler now rather than after the grace left for that client.
	if _, err := ts.db.Exec(context.Background(),
		`UPDATE idempotency_keys SET next_attempt_at = now() WHERE key = 'traced-reconciled'`); err != nil {
		t.Fatal(err)
	}
	if n, err := ts.reconciler(t, time.Second).RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("the reconciler claimed %d records (%v); want 1", n, err)
	}
	// RunOnce returns after the resumption's span has ended.
	spans := spanTree(rec.Ended())
	resume := spans.one(t, "reconciler resume")
	wantLinkedRoot(t, resume, request, id)
	wantAttrs(t, resume, map[string]string{
		"idempotency.operation": "createCharge", "idempotency.key_hash": idempotency.KeyHash("acme", "traced-reconciled"),
		"idempotency.recovery_point": "charge_created",
	})
	call := spans.named("processor charges")
	if len(call) != 2 {
		t.Fatalf("%d processor calls; want the request's and the reconciler's: %s", len(call), spans)
	}
	wantChild(t, call[1], resume)
}

// The stored trace context is bounded by the schema, whatever writes it:
// the version-00 traceparent the SDK renders (55 characters, lower-case
// hex), nothing longer or looser.
func TestStoredTraceparentIsBounded(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	ts.paidCharge(t, 700) // a key record and two events
	good := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, table := range []string{"idempotency_keys", "events"} {
		if _, err := ts.db.Exec(context.Background(), `UPDATE `+table+` SET traceparent = $1`, good); err != nil {
			t.Errorf("%s: a valid traceparent refused: %v", table, err)
		}
		for _, bad := range []string{
			good + "-extra",
			strings.ToUpper(good),
			"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
		} {
			_, err := ts.db.Exec(context.Background(), `UPDATE `+table+` SET traceparent = $1`, bad)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" { // check_violation
				t.Errorf("%s: traceparent %q stored (%v); want a check violation", table, bad, err)
			}
		}
	}
}

// The relay's deliveries of a charge's events are traces of their own,
// each linked to the phase that wrote its event, in the request's trace.
func TestTraceOfARelayDeliveryIsLinkedToItsRequest(t *testing.T) {
	t.Parallel()
	// Without the processor's webhooks: its charge.succeeded may otherwise
	// reach the server before the charge's final phase commits and record
	// the outcome first (as designed), and then the events are the
	// webhook's work, linked to the webhook request's trace, not this one.
	ts := newTestServer(t, withDemo, func(o *serverOptions) { o.noWebhooks = true }) // the demo's receiver takes the deliveries
	o := ts.newOrder(t, "sk_test_acme", 1500)
	tp, id, rec := newTrace(t)
	if res := ts.do(t, traced(chargeRequest(o.ID, "traced-delivered", "pm_card_visa"), tp)); res.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", res.Status, res.Body)
	}
	final := waitForSpans(t, rec, chargeRoute).one(t, "phase charge_created")
	drain(t, ts.db, ts.relay(t))
	spans := spanTree(rec.Ended())
	deliveries := spans.named("relay delivery")
	if len(deliveries) != 2 {
		t.Fatalf("%d deliveries traced; want 2 (charge.succeeded, order.paid): %s", len(deliveries), spans)
	}
	for _, d := range deliveries {
		wantLinkedRoot(t, d, final, id)
	}
	if deliveries[0].SpanContext().TraceID() == deliveries[1].SpanContext().TraceID() {
		t.Error("two deliveries share a trace; want one each")
	}
}

// With tracing on, every request is traced, whether or not its client
// sent a traceparent: its log line names its trace, which is recorded.
func TestRequestWithoutTraceparentIsTracedWhenTracingIsOn(t *testing.T) {
	t.Parallel()
	tr := testTracing(t)
	var logs syncBuffer
	ts := newTestServer(t, func(o *serverOptions) { o.logs = &logs })
	key := "untraced-" + rand.Text()
	if res := ts.createOrder(t, key, teaOrder); res.Status != http.StatusCreated {
		t.Fatalf("create order: %d %s", res.Status, res.Body)
	}
	var traceID string
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil && l["msg"] == "request" && l["key_hash"] == idempotency.KeyHash("acme", key) {
			traceID, _ = l["trace_id"].(string)
		}
	}
	if traceID == "" {
		t.Fatalf("the request's log line names no trace:\n%s", logs.String())
	}
	waitFor(t, 5*time.Second, "the request's trace in the store", func() bool {
		spans, _ := tr.Recent.Trace(traceID)
		for _, s := range spans {
			if s.Name == "POST /v1/orders" && s.Parent == "" {
				return true
			}
		}
		return false
	})
}
