package fakeprocessor

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// emit queues the event of ledger entry e, typed <object>.<status> (such as
// charge.failed), twice with the chaos probability of a duplicate. Both
// copies carry the same event id, which the receiver deduplicates on. It
// never blocks, so it is safe to call while holding a key's turn or s.mu.
func (s *Server) emit(e LedgerEntry) {
	if s.webhooks == nil {
		return
	}
	body := mustJSON(Event{ID: newID("evt"), Type: e.Object + "." + e.Status, Created: s.cfg.Now().Unix(), Data: EventData{
		ID: e.ID, DownstreamKey: e.IdempotencyKey, Amount: e.Amount, Currency: e.Currency, Status: e.Status,
		DeclineCode: optional(e.DeclineCode), Charge: e.Charge, FailureCode: optional(e.FailureCode),
	}})
	s.webhooks.enqueue(&pending{body: body, due: time.Now()})
	if s.draw(func(c Chaos) float64 { return c.DuplicateWebhookRate }) {
		s.webhooks.enqueue(&pending{body: body, due: time.Now()})
	}
}

// deliverer sends events to the webhook URL at least once, from one
// goroutine, retrying an attempt that errs or answers anything but 2xx with
// full-jitter backoff (see Config) a bounded number of times. The queue is
// ordered by due time, so an event backing off does not hold up the others,
// but a receiver that hangs delays everything by up to WebhookTimeout per
// attempt. As with any real webhook sender, delivery order is not guaranteed.
type deliverer struct {
	cfg    Config
	jitter func(time.Duration) time.Duration

	mu    sync.Mutex
	queue []*pending
	// wake has room for one signal: enqueue never blocks, and a signal
	// sent while the loop is busy is still seen when it next waits.
	wake chan struct{}

	ctx    context.Context // canceled by Server.Close
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
	d := &deliverer{cfg: cfg, jitter: jitter, wake: make(chan struct{}, 1), done: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	go d.run()
	return d
}

func (d *deliverer) enqueue(p *pending) {
	d.mu.Lock()
	d.queue = append(d.queue, p)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
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
		var fire <-chan time.Time
		if wait >= 0 {
			fire = time.After(wait) // collected unfired since Go 1.23
		}
		select {
		case <-d.ctx.Done():
			return
		case <-d.wake:
		case <-fire:
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
	p := slices.MinFunc(d.queue, func(a, b *pending) int { return a.due.Compare(b.due) })
	if wait := time.Until(p.due); wait > 0 {
		return nil, wait
	}
	d.queue = slices.DeleteFunc(d.queue, func(q *pending) bool { return q == p })
	return p, 0
}

// attempt makes one delivery and, if it failed, schedules the next.
func (d *deliverer) attempt(p *pending) {
	p.attempts++
	err := d.send(p.body)
	if err == nil || d.ctx.Err() != nil {
		return // delivered, or closing: the attempt was cut short, not refused
	}
	if p.attempts >= d.cfg.WebhookMaxAttempts {
		d.cfg.Logger.Warn("webhook abandoned", "attempts", p.attempts, "err", err)
		return
	}
	// min(cap, base·2^(attempts-1)), doubled step by step so it cannot overflow.
	ceiling := d.cfg.WebhookBackoffBase
	for i := 1; i < p.attempts && ceiling < d.cfg.WebhookBackoffCap; i++ {
		ceiling *= 2
	}
	backoff := d.jitter(min(ceiling, d.cfg.WebhookBackoffCap))
	// Routine while the receiver restarts: debug. Giving up is the line an
	// operator needs, and it is a warning (above).
	d.cfg.Logger.Debug("webhook delivery failed; will retry", "attempt", p.attempts, "retry_in", backoff, "err", err)
	p.due = time.Now().Add(backoff)
	d.enqueue(p)
}

// send POSTs the event, signed at the time of this attempt: a retry carries
// a fresh timestamp, so a receiver's tolerance window applies to the
// attempt rather than to when the event happened.
func (d *deliverer) send(body []byte) error {
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.WebhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "payments-fake-processor")
	req.Header.Set(SignatureHeader, sign(d.cfg.WebhookSecret, d.cfg.Now(), body))
	res, err := d.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	// Drain so the connection can be reused for the next delivery; the
	// status is the answer, so a failure to read the rest changes nothing.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	_ = res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("webhook receiver answered %d", res.StatusCode)
	}
	return nil
}

// sign is the Processor-Signature of body sent at t:
// t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>. The processor shares
// no code with the payments server, which verifies it (cardprocessor.Verify).
func sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts + "."))
	h.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(h.Sum(nil))
}
