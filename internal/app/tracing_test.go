package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

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
	watched     = &traceWatch{recorders: map[trace.TraceID]*tracetest.SpanRecorder{}}
)

func testTracing(t testing.TB) *Tracing {
	t.Helper()
	tracingOnce.Do(func() { tracing, tracingErr = SetupTracing(context.Background(), true, watched) })
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

func (w *traceWatch) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) {}
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
		delete(watched.recorders, id)
		watched.mu.Unlock()
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
			return kv.Value.Emit()
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
			if bytes.Contains([]byte(kv.Value.Emit()), []byte(key)) {
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
