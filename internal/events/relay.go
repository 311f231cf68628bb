package events

// The relay posts each outbox event, signed, to its caller's endpoint,
// retrying with backoff until acknowledged. Relays (one per replica) share
// the queue through FOR UPDATE SKIP LOCKED. At least once: a relay that
// crashes after the endpoint answered but before recording it delivers the
// event again, so receivers deduplicate on the event id (as the demo's does).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/retry"
)

// SignatureHeader carries the signature of a delivery, in the processor's
// scheme: t=<unix>,v1=<hex HMAC-SHA256(secret, t + "." + body)>.
const SignatureHeader = "Payments-Signature"

// RelayConfig tunes the relay.
type RelayConfig struct {
	Interval time.Duration // the pause between scans that found nothing due
	Batch    int           // the most events claimed per scan
	// Lease keeps other relays off a claimed event while it is delivered;
	// it must exceed the HTTP timeout.
	Lease   time.Duration
	Timeout time.Duration // bounds one delivery
	// DemoURL + the caller id is the demo receiver, for callers without a
	// webhook URL (DEMO_MODE only); empty, their events wait to be pulled.
	DemoURL string
	// AllowPrivate lets endpoints be loopback or private addresses (the
	// demo, tests); otherwise the relay refuses to connect to them.
	AllowPrivate bool
	// BackoffBase and BackoffCap shape the delay before a retry: full
	// jitter, random(0, min(cap, base·2^attempts)).
	BackoffBase, BackoffCap time.Duration
}

// Relay is the background worker.
type Relay struct {
	cfg    RelayConfig
	pool   *pgxpool.Pool
	client *http.Client
	log    *slog.Logger
}

// NewRelay returns a relay. It refuses an invalid configuration.
func NewRelay(cfg RelayConfig, pool *pgxpool.Pool, log *slog.Logger) (*Relay, error) {
	var p config.Problems
	p.Check(cfg.Interval > 0, "Interval must be positive")
	p.Check(cfg.Batch >= 1, "Batch must be at least 1")
	p.Check(cfg.Timeout > 0, "Timeout must be positive")
	// A batch is delivered at once, under the lease taken at its claim.
	p.Check(cfg.Lease > cfg.Timeout, "Lease must be longer than Timeout")
	p.Check(cfg.BackoffBase > 0 && cfg.BackoffCap >= cfg.BackoffBase, "BackoffBase must be positive and BackoffCap at least BackoffBase")
	if err := p.Err("relay"); err != nil {
		return nil, err
	}
	// No proxy: the address checked must be the endpoint's own.
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowPrivate {
		dialer.Control = publicOnly
	}
	client := &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{DialContext: dialer.DialContext},
		// A redirect is not an acknowledgement: the event is delivered
		// to the URL the caller set, or retried.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &Relay{cfg: cfg, pool: pool, client: client, log: log}, nil
}

// Run delivers until ctx is done.
func (r *Relay) Run(ctx context.Context) {
	postgres.Poll(ctx, "relay", r.cfg.Interval, r.cfg.Batch, r.log, r.RunOnce)
}

// Delivery is the body posted to a caller's endpoint.
type Delivery struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// RunOnce claims the due events and tries to deliver each once, all at
// once; it returns how many it claimed.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	// A claim canceled mid-statement could commit without the relay
	// learning what it took, leaving those events to wait out their lease:
	// a stopped relay claims nothing, and a claim, once made, is seen through.
	if ctx.Err() != nil {
		return 0, nil
	}
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	due, err := queries.ClaimUndeliveredEvents(claimCtx, r.pool, dbsqlc.ClaimUndeliveredEventsParams{
		MaxEvents: int32(r.cfg.Batch), LeaseSeconds: r.cfg.Lease.Seconds(), // #nosec G115 -- the batch is a handful, set in internal/app
	})
	cancel()
	if err != nil {
		return 0, err
	}
	// At once: an endpoint that hangs holds up only its own events.
	errs := make([]error, len(due))
	var wg sync.WaitGroup
	for i, ev := range due {
		wg.Go(func() { errs[i] = r.handle(ctx, ev) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return len(due), err
	}
	if len(due) < r.cfg.Batch {
		// Caught up for now: how far behind is the outbox?
		if lag, err := queries.OutboxLagSeconds(ctx, r.pool); err == nil {
			metrics.OutboxLag.Set(lag)
		}
	}
	return len(due), nil
}

// handle delivers ev once and records how it went.
func (r *Relay) handle(ctx context.Context, ev dbsqlc.ClaimUndeliveredEventsRow) error {
	if ev.WebhookUrl == nil && r.cfg.DemoURL == "" {
		// Nowhere to push it: it waits to be pulled.
		return queries.ParkEvent(ctx, r.pool, dbsqlc.ParkEventParams{CallerID: ev.CallerID, ID: ev.ID})
	}
	if failed := r.deliver(ctx, ev); failed != nil {
		metrics.RelayDeliveries.WithLabelValues("failed").Inc()
		delay := retry.FullJitter(r.cfg.BackoffBase, r.cfg.BackoffCap, int(ev.DeliveryAttempts))
		r.log.InfoContext(ctx, "relay: delivery failed, will retry", "caller", ev.CallerID, "event", ev.ID,
			"attempt", ev.DeliveryAttempts, "retry_in", delay, "err", failed)
		return queries.RetryEventAfter(ctx, r.pool, dbsqlc.RetryEventAfterParams{CallerID: ev.CallerID, ID: ev.ID, DelaySeconds: delay.Seconds()})
	}
	metrics.RelayDeliveries.WithLabelValues("delivered").Inc()
	return queries.MarkEventDelivered(ctx, r.pool, dbsqlc.MarkEventDeliveredParams{CallerID: ev.CallerID, ID: ev.ID})
}

// tracer makes the relay's spans; the global API's, as everywhere.
var tracer = otel.Tracer("github.com/retrysafe/payments/internal/events")

func (r *Relay) deliver(ctx context.Context, ev dbsqlc.ClaimUndeliveredEventsRow) (err error) {
	// Each delivery is a trace of its own (the receiver may continue it): an
	// event is delivered long after the request that caused it, perhaps many
	// times. It links to the work that wrote the event, when that was traced.
	ctx, span := tracer.Start(ctx, "relay delivery", append(postgres.LinkTo(ev.Traceparent),
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("event.id", ev.ID), attribute.String("event.type", ev.Type),
			attribute.Int("event.delivery_attempt", int(ev.DeliveryAttempts))))...)
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, "")
		}
		span.End()
	}()
	endpoint := r.cfg.DemoURL + ev.CallerID
	if ev.WebhookUrl != nil {
		endpoint = *ev.WebhookUrl
	}
	body, err := json.Marshal(Delivery{ID: ev.ID, Type: ev.Type, CreatedAt: ev.CreatedAt, Data: ev.Data})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	// Signed by the previous secret too while a rotation overlaps: the
	// receiver accepts any signature it verifies.
	var previous [][]byte
	if ev.PreviousWebhookSecret != "" {
		previous = append(previous, []byte(ev.PreviousWebhookSecret))
	}
	req.Header.Set(SignatureHeader, cardprocessor.Sign([]byte(ev.WebhookSecret), time.Now(), body, previous...))
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	res, err := r.client.Do(req)
	if err != nil {
		// Not the *url.Error itself: its message has the whole URL.
		return fmt.Errorf("posting to %s: %w", Redact(endpoint), errors.Unwrap(err))
	}
	_ = res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("endpoint answered %d", res.StatusCode)
	}
	return nil
}
