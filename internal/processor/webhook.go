package processor

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// emit queues an event for delivery, twice with the chaos probability of a
// duplicate. Both copies carry the same event id, which is what the
// receiver deduplicates on. It never blocks, so it is safe to call while
// holding a key's turn.
func (s *Server) emit(eventType string, data EventData) {
	if s.webhooks == nil {
		return
	}
	body := mustJSON(Event{ID: newID(prefixEvent), Type: eventType, Created: s.cfg.Now().Unix(), Data: data})
	copies := 1
	if s.draw(func(c Chaos) float64 { return c.DuplicateWebhookRate }) {
		copies = 2
	}
	for range copies {
		s.webhooks.enqueue(body)
	}
}

// deliverer sends events to the webhook URL from one background goroutine,
// at least once: an attempt that errs or answers anything but 2xx is retried
// with capped, fully jittered exponential backoff, up to a bounded number of
// attempts. One goroutine keeps the fake simple; it orders the queue by due
// time, so an event that is backing off does not hold up the others, but a
// receiver that hangs delays everything by up to WebhookTimeout per attempt.
// Delivery order is not guaranteed (a retried event arrives after later
// ones), as with any real webhook sender.
type deliverer struct {
	url         string
	secret      []byte
	client      *http.Client
	maxAttempts int
	base        time.Duration
	backoffCap  time.Duration
	timeout     time.Duration
	now         func() time.Time
	jitter      func(time.Duration) time.Duration
	log         *slog.Logger

	mu    sync.Mutex
	queue []*pending
	// wake has room for one signal: enqueue never blocks, and a signal
	// sent while the loop is busy is still seen when it next waits.
	wake chan struct{}

	ctx    context.Context // canceled by close
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
}

// pending is one copy of an event waiting to be delivered.
type pending struct {
	body     []byte
	attempts int       // made so far
	due      time.Time // wall clock; not before this
}

func newDeliverer(cfg Config, jitter func(time.Duration) time.Duration) *deliverer {
	ctx, cancel := context.WithCancel(context.Background())
	d := &deliverer{
		url:         cfg.WebhookURL,
		secret:      cfg.WebhookSecret,
		client:      cfg.HTTPClient,
		maxAttempts: cfg.WebhookMaxAttempts,
		base:        cfg.WebhookBackoffBase,
		backoffCap:  cfg.WebhookBackoffCap,
		timeout:     cfg.WebhookTimeout,
		now:         cfg.Now,
		jitter:      jitter,
		log:         cfg.Logger,
		wake:        make(chan struct{}, 1),
		ctx:         ctx,
		cancel:      cancel,
		done:        make(chan struct{}),
	}
	go d.run()
	return d
}

func (d *deliverer) enqueue(body []byte) {
	d.mu.Lock()
	d.queue = append(d.queue, &pending{body: body, due: time.Now()})
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func (d *deliverer) close() {
	d.cancel()
	<-d.done
}

func (d *deliverer) run() {
	defer close(d.done)
	for {
		p, wait := d.next()
		if p != nil {
			d.attempt(p)
			continue
		}
		// Nothing due: sleep until the earliest due time (wait > 0), or
		// until something is queued (wait < 0: the queue is empty).
		var timer *time.Timer
		var fire <-chan time.Time
		if wait >= 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-d.ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-d.wake:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// next removes and returns a due delivery; otherwise it returns nil and how
// long until the earliest one is due (-1 if the queue is empty).
func (d *deliverer) next() (*pending, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.queue) == 0 {
		return nil, -1
	}
	earliest := 0
	for i, p := range d.queue {
		if p.due.Before(d.queue[earliest].due) {
			earliest = i
		}
	}
	p := d.queue[earliest]
	if wait := time.Until(p.due); wait > 0 {
		return nil, wait
	}
	d.queue = append(d.queue[:earliest], d.queue[earliest+1:]...)
	return p, 0
}

// attempt makes one delivery and, if it failed, schedules the next.
func (d *deliverer) attempt(p *pending) {
	p.attempts++
	err := d.send(p.body)
	if err == nil {
		return
	}
	if d.ctx.Err() != nil {
		return // closing: the attempt was cut short, not refused
	}
	if p.attempts >= d.maxAttempts {
		d.log.Warn("webhook abandoned", "attempts", p.attempts, "err", err)
		return
	}
	backoff := d.jitter(d.ceiling(p.attempts))
	// Routine while the receiver restarts: debug. Giving up is the line an
	// operator needs, and it is a warning (above).
	d.log.Debug("webhook delivery failed; will retry", "attempt", p.attempts, "retry_in", backoff, "err", err)
	p.due = time.Now().Add(backoff)
	d.mu.Lock()
	d.queue = append(d.queue, p)
	d.mu.Unlock()
}

// ceiling is min(cap, base·2^(attempt-1)), doubling step by step so that it
// cannot overflow.
func (d *deliverer) ceiling(attempt int) time.Duration {
	c := d.base
	for i := 1; i < attempt && c < d.backoffCap; i++ {
		c *= 2
	}
	return min(c, d.backoffCap)
}

// send POSTs the event, signed at the time of this attempt: a retry carries
// a fresh timestamp, so a receiver's tolerance window applies to the
// attempt rather than to when the event happened.
func (d *deliverer) send(body []byte) error {
	ctx, cancel := context.WithTimeout(d.ctx, d.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "payments-fake-processor")
	req.Header.Set(SignatureHeader, sign(d.secret, d.now(), body))
	res, err := d.client.Do(req)
	if err != nil {
		return err
	}
	// Drain so the connection can be reused for the next delivery; the
	// status is the answer, so a failure to read the rest changes nothing.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	_ = res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return &statusError{res.StatusCode}
	}
	return nil
}

type statusError struct{ code int }

func (e *statusError) Error() string { return "webhook receiver answered " + strconv.Itoa(e.code) }

// sign is the Processor-Signature of body sent at t:
// t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>. The processor is a
// service of its own; the payments server verifies the scheme with
// cardprocessor.Verify.
func sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts + "."))
	h.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(h.Sum(nil))
}
