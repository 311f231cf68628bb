// Package metrics holds the service's Prometheus metrics, in one registry
// served at /metrics, all defined here so that an operator reads in one
// place what the service measures (each metric's help text says what); the
// packages doing the work only increment them.
//
// Names follow Prometheus's conventions: a payments_ prefix, base units
// (seconds), _total on counters. Labels take few values (a route template,
// never a path with ids; an outcome from a fixed list), so the number of
// series stays small whatever the traffic.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry holds every metric of the server process, and the Go runtime's
// and the process's own.
var Registry = prometheus.NewRegistry()

func init() {
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

func register[C prometheus.Collector](c C) C {
	Registry.MustRegister(c)
	return c
}

func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

func plainCounter(name, help string) prometheus.Counter {
	return register(prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

func histogram(name, help string, labels ...string) *prometheus.HistogramVec {
	return register(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets}, labels))
}

// latencyBuckets span a replay (1ms) to a processor timeout (10s).
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// HTTP. A route label is a template (/v1/orders/:order_id), "unmatched"
// for paths no route serves.
var (
	HTTPRequests = counter("payments_http_requests_total",
		"HTTP requests answered, by route template, method and status.", "route", "method", "status")
	HTTPDuration = histogram("payments_http_request_duration_seconds",
		"Time to answer an HTTP request, by route template and method.", "route", "method")
	RetryHints = counter("payments_http_retry_hints_total",
		"Answers that told the client to retry after Retry-After (409 in progress, 503), by status.", "status")
)

// Dead-letter kinds.
const (
	DeadLetterOperation      = "operation"
	DeadLetterPayoutJob      = "payout_job"
	DeadLetterProcessorEvent = "processor_event"
)

// Why a waiting duplicate woke up to look at its record again.
const (
	WakeNotified = "notified" // its record's NOTIFY, or the listener's reconnection
	WakeTimer    = "timer"    // the slow timer: a notification lost, or late
	WakeLease    = "lease"    // the owner's lease could have lapsed (an owner that died notifies no one)
	WakeDeadline = "deadline" // IDEMPOTENCY_WAIT ran out
	WakeGone     = "gone"     // the client went away
)

// Keyed requests: what their claims found, and how long duplicates waited
// (IDEMPOTENCY_WAIT) for the original's answer, whatever they got.
var (
	IdempotencyOutcomes = counter("payments_idempotency_outcomes_total",
		"Keyed requests by operation and what the claim found: new, replayed, in_progress, mismatch, resumed, taken_over, dead.",
		"operation", "outcome")
	IdempotencyWaitSeconds = register(prometheus.NewHistogram(prometheus.HistogramOpts{Name: "payments_idempotency_wait_seconds",
		Help: "How long a duplicate waited on the server for the original request's answer.", Buckets: latencyBuckets}))
	// Nearly all wake-ups should be notified: many timer wake-ups mean
	// notifications are lost or late, costing latency (up to a second
	// each), never correctness.
	IdempotencyWaitWakeups = counter("payments_idempotency_wait_wakeups_total",
		"Wake-ups of duplicates waiting for the original request, by cause: notified, timer, lease, deadline, gone.",
		"cause")
	// ReplayCacheHits are also counted as replayed.
	ReplayCacheHits = plainCounter("payments_idempotency_replay_cache_hits_total",
		"Replays answered from this process's replay cache, without a database round trip.")
)

// The processor: call is charge, refund, payout or get_payout; result is
// success, refused (a definite no), rejected (our downstream key refused: set
// aside) or uncertain (a timeout, a dropped connection, a 5xx, 429 or 409).
var (
	ProcessorCalls = counter("payments_processor_calls_total",
		"Calls to the card processor, by call and result (success, refused, rejected, uncertain).", "call", "result")
	ProcessorDuration = histogram("payments_processor_call_duration_seconds",
		"Latency of calls to the card processor, by call.", "call")
)

// The background workers.
var (
	ReconcilerTakeovers = plainCounter("payments_reconciler_takeovers_total",
		"Stalled keyed operations the reconciler claimed.")
	ReconcilerResumes = counter("payments_reconciler_resumes_total",
		"Operations the reconciler resumed, by result (finished, not_finished, abandoned).", "result")
	ReconcilerDeadLetters = plainCounter("payments_reconciler_dead_letters_total",
		"Operations the reconciler set aside for an operator (dead).")
	// DeadLetters are, besides the reconciler's own: an operation the
	// processor rejected, a payout job given up on, a processor webhook that
	// contradicts what the service knows. `server dead-letters` lists them.
	DeadLetters = counter("payments_dead_letters_total",
		"Things set aside for an operator, by kind (operation, payout_job, processor_event).", "kind")
	RelayDeliveries = counter("payments_relay_deliveries_total",
		"Outbox event deliveries to callers' endpoints, by result (delivered, failed).", "result")
	OutboxLag = register(prometheus.NewGauge(prometheus.GaugeOpts{Name: "payments_outbox_lag_seconds",
		Help: "Age of the oldest outbox event not yet delivered, as of the relay's last scan (0: none waiting)."}))
)

// Handler serves the registry in Prometheus's text format.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{Registry: Registry})
}
