package idempotency

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Listener holds the one connection per process that LISTENs for the
// records duplicates wait on (migration 0021), and wakes a record's waiters
// when it is notified: two hundred duplicates cost one connection. A lost
// notification costs only latency: each waiter reads its record again
// after registering and on a timer, and a lost connection wakes them all.
type Listener struct {
	connect func(context.Context) (*pgx.Conn, error)
	log     *slog.Logger

	mu      sync.Mutex
	waiting map[recordRef]map[chan struct{}]struct{}

	// listening is closed once the first LISTEN took effect and the
	// waiters registered meanwhile were woken (tests wait for it).
	listening     chan struct{}
	listeningOnce sync.Once
}

// recordRef names a record as its notification does.
type recordRef struct {
	callerID string
	id       int64
}

// listenChannel is what migration 0021's triggers notify, with payload
// "<caller_id>/<id>".
const listenChannel = "idempotency_keys"

// NewListener returns a Listener that connects with connect once Run runs.
func NewListener(connect func(context.Context) (*pgx.Conn, error), log *slog.Logger) *Listener {
	return &Listener{connect: connect, log: log, waiting: map[recordRef]map[chan struct{}]struct{}{}, listening: make(chan struct{})}
}

// watch registers a waiter for a record: wake receives when the record is
// notified (or may have been missed). Call cancel when done.
func (l *Listener) watch(callerID string, id int64) (wake <-chan struct{}, cancel func()) {
	ref := recordRef{callerID, id}
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.waiting[ref] == nil {
		l.waiting[ref] = map[chan struct{}]struct{}{}
	}
	l.waiting[ref][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.waiting[ref], ch)
		if len(l.waiting[ref]) == 0 {
			delete(l.waiting, ref)
		}
		l.mu.Unlock()
	}
}

// wake wakes the waiters of ref, or every waiter when all is set.
func (l *Listener) wake(ref recordRef, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, chans := range l.waiting {
		if !all && r != ref {
			continue
		}
		for ch := range chans {
			select {
			case ch <- struct{}{}:
			default: // already woken, not yet looked
			}
		}
	}
}

// Run keeps a connection LISTENing until ctx ends, reconnecting with a
// growing pause after a failure.
func (l *Listener) Run(ctx context.Context) {
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		l.wake(recordRef{}, true) // notifications were lost: all look again
		l.log.WarnContext(ctx, "idempotency: listening for waited-on records failed; connecting again", "err", err, "in", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

func (l *Listener) listen(ctx context.Context) error {
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+listenChannel); err != nil {
		return err
	}
	l.wake(recordRef{}, true) // for what was notified before LISTEN took effect
	l.listeningOnce.Do(func() { close(l.listening) })
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		callerID, id, ok := strings.Cut(n.Payload, "/")
		if num, err := strconv.ParseInt(id, 10, 64); ok && err == nil {
			l.wake(recordRef{callerID, num}, false)
		}
	}
}
