package app

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/retrysafe/payments/internal/testdb"
)

// otlpReceiver is a test OTLP/HTTP receiver: it keeps every span it is
// sent, by trace id, with the service name of its resource.
type otlpReceiver struct {
	URL      string
	mu       sync.Mutex
	spans    map[string][]*tracepb.Span
	services map[string]bool
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{spans: map[string][]*tracepb.Span{}, services: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var export collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &export)
		}
		if req.URL.Path != "/v1/traces" || err != nil {
			t.Errorf("OTLP receiver: %s %s: %v", req.Method, req.URL.Path, err)
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					r.services[kv.Value.GetStringValue()] = true
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					id := hex.EncodeToString(s.TraceId)
					r.spans[id] = append(r.spans[id], s)
				}
			}
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// trace returns the spans received of trace id, by name.
func (r *otlpReceiver) trace(id string) map[string][]*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]*tracepb.Span{}
	for _, s := range r.spans[id] {
		out[s.Name] = append(out[s.Name], s)
	}
	return out
}

func otlpAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return strconv.FormatInt(v.IntValue, 10)
			}
		}
	}
	return ""
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, the server (the real binary, as
// deployed) exports its spans over OTLP, under OTEL_SERVICE_NAME. And the
// trace of a charge resumed after a crash reads as the pattern says: the
// server is killed (SIGKILL) right after the processor answered, before
// the final phase; the client's retry, in a trace of its own, takes the
// record over (attempt 2, at charge_created), runs no first phase, calls
// the processor again under the same downstream key and runs the final
// phase.
func TestSpansReachAnOTLPReceiverAndShowACrashResumed(t *testing.T) {
	t.Parallel()
	receiver := newOTLPReceiver(t)
	processorURL := startProcessorProcess(t)
	dbURL := testdb.New(t)
	db := testdb.Pool(t, dbURL)
	common := []string{"PROCESSOR_URL=" + processorURL, "IDEMPOTENCY_LEASE=2s", "PROCESSOR_TIMEOUT=1s", "RECONCILER_ENABLED=false",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + receiver.URL, "OTEL_SERVICE_NAME=payments-otlp-test", "OTEL_BSP_SCHEDULE_DELAY=100"}
	doomed := startServerProcess(t, dbURL, append(common, "FAULT_CRASH_POINTS="+AfterProcessorCall)...)
	doomed.db = db
	o := doomed.newOrder(t, "sk_test_acme", 2500)
	const key = "otlp-crash"
	tp1, _, _ := newTrace(t)
	if _, err := doomed.send(t, context.Background(), traced(chargeRequest(o.ID, key, "pm_card_visa"), tp1)); err == nil {
		t.Fatal("the request got an answer; the server should have died after the processor call")
	}
	if err := doomed.cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("server exit: %v; want killed", err)
	}

	restarted := startServerProcess(t, dbURL, common...)
	restarted.db = db
	tp2, id2, _ := newTrace(t)
	// The retry: the server waits (IDEMPOTENCY_WAIT) for the dead owner's
	// lease to lapse and takes the record over; a 409 says when to ask
	// again, and the client waits that long, as told.
	var res response
	for range 10 {
		res = restarted.do(t, traced(chargeRequest(o.ID, key, "pm_card_visa"), tp2))
		if res.Status != http.StatusConflict {
			break
		}
		wait, _ := strconv.Atoi(res.Header.Get("Retry-After"))
		time.Sleep(time.Duration(wait) * time.Second) // as Retry-After says: the client's pacing, not a wait for a state
	}
	if res.Status != http.StatusCreated {
		t.Fatalf("the retry after the crash: %d %s", res.Status, res.Body)
	}
	var spans map[string][]*tracepb.Span
	waitFor(t, 20*time.Second, "the retry's spans at the OTLP receiver", func() bool {
		spans = receiver.trace(id2.String())
		return len(spans[chargeRoute]) > 0 && len(spans["phase charge_created"]) > 0
	})
	receiver.mu.Lock()
	named := receiver.services["payments-otlp-test"]
	receiver.mu.Unlock()
	if !named {
		t.Errorf("no span came under OTEL_SERVICE_NAME payments-otlp-test")
	}
	var takeover *tracepb.Span
	for _, c := range spans["idempotency.claim"] {
		if otlpAttr(c, "idempotency.outcome") == "taken_over" {
			takeover = c
		}
	}
	if takeover == nil {
		t.Fatalf("no claim took the record over; the claims: %v", spans["idempotency.claim"])
	}
	if a, rp := otlpAttr(takeover, "idempotency.attempt"), otlpAttr(takeover, "idempotency.recovery_point"); a != "2" || rp != "charge_created" {
		t.Errorf("the takeover's claim: attempt %s at %s; want attempt 2 at charge_created", a, rp)
	}
	if n := len(spans["phase started"]); n != 0 {
		t.Errorf("the retry ran the first phase again (%d spans)", n)
	}
	var downstream string
	if err := db.QueryRow(context.Background(), `SELECT downstream_key FROM charges WHERE order_id = $1`, o.ID).Scan(&downstream); err != nil {
		t.Fatal(err)
	}
	if calls := spans["processor charges"]; len(calls) != 1 || otlpAttr(calls[0], "processor.downstream_key") != downstream {
		t.Errorf("the retry's processor calls: %v; want one, under %s", calls, downstream)
	}
	if final := spans["phase charge_created"]; otlpAttr(final[0], "idempotency.attempt") != "2" || otlpAttr(final[0], "idempotency.reached_point") != "finished" {
		t.Errorf("the final phase: %v; want attempt 2, reaching finished", final[0].Attributes)
	}
}

// Without an OTLP endpoint (and outside the demo), no provider is
// installed: the global tracer stays the no-op one, and nothing is
// recorded or exported. OTEL_SDK_DISABLED wins over an endpoint.
func TestTracingIsOffWithoutAnEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tr, err := SetupTracing(context.Background(), false)
	if err != nil || tr.provider != nil || tr.Exporting || tr.Recent != nil {
		t.Errorf("SetupTracing with nothing set: %+v, %v; want no provider, no exporter, no store", tr, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if tr, err := SetupTracing(context.Background(), true); err != nil || tr.provider != nil || tr.Exporting {
		t.Errorf("SetupTracing with OTEL_SDK_DISABLED=true: %+v, %v; want nothing", tr, err)
	}
}
