package idempotency

import (
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction as an argument

// Request is one keyed request: who sent it, under which key, and what it
// asked for.
type Request struct {
	CallerID string
	Key      string
	// Operation is the contract's operationId (createCharge). It is stored
	// with the record and names the declaration that resumes it
	// (operation.go).
	Operation   string
	Method      string
	Path        string
	Fingerprint []byte
}

// RecoveryPoint names a phase boundary an operation has passed. Every
// operation starts at RecoveryStarted and ends at RecoveryFinished; an
// operation with an external effect defines the points in between.
type RecoveryPoint string

const (
	RecoveryStarted  RecoveryPoint = "started"
	RecoveryFinished RecoveryPoint = "finished"
)

// ErrLeaseLost means a newer attempt took the record over: the phase that
// found out has been rolled back and the caller must stop driving it.
var ErrLeaseLost = errors.New("idempotency: lease lost to a newer attempt")

// ErrSetAside marks a Handler's error (wrap it: fmt.Errorf("%w: %w",
// ErrSetAside, err)) as one that no retry can fix and that no final answer
// may record, such as the processor refusing our downstream key because it
// saw it with another request. The record is set aside for a person at
// once (status dead), rather than retried by the reconciler until it gives
// up, or stored as a failure that may not be true.
var ErrSetAside = errors.New("idempotency: set aside for an operator")

// Store runs keyed operations against the idempotency_keys table.
type Store struct {
	pool    *pgxpool.Pool
	lease   time.Duration
	maxRun  time.Duration
	wait    time.Duration
	waiters *Listener // nil: duplicates do not wait (wait is 0)
	log     *slog.Logger
	replays *replayCache // nil: every replay reads the database
	faults  Faults       // nil in production
}

// Faults are the test facility's ways into the engine: the demo and the
// crash tests kill the process at the places they name, the history check's
// tests stall an owner past its lease and plant a bug. Production passes
// none (StoreConfig.Faults is nil), and no operation's code carries them.
type Faults interface {
	// AfterClaim runs once a request's claim gave it the record (a new one,
	// or one taken over), before it starts work and before its heartbeat
	// starts renewing the lease.
	AfterClaim(Record)
	// AfterPhase runs once a phase has committed, with the record as it
	// now stands (at the recovery point the phase reached).
	AfterPhase(Record)
	// BeforeFinalCommit runs inside the final phase of an operation that
	// has more than one, after the phase's own writes and before the
	// record's completion and the commit, which are sent together: the
	// effect is written but not committed.
	BeforeFinalCommit(Record)
	// Unfenced says whether a completion is written without its fence (a
	// PLANTED BUG: CompleteIdempotencyKeyUnfenced), for the test that shows
	// the history check catches it.
	Unfenced() bool
}

// StoreConfig tunes a Store.
type StoreConfig struct {
	// Lease is how long an owner holds a record without renewing it. An
	// owner renews it every third of a lease while it works (the processor
	// call included), so a live owner never loses it to a short lease, and
	// a crashed one is noticed within one lease: after that, a retry or
	// the reconciler takes the record over (IDEMPOTENCY_LEASE).
	//
	// It is also the grace the reconciler gives a client: after a request
	// ends in a transient failure (its client told to retry), the
	// reconciler leaves the record alone for one lease, so that the
	// client's own retry, not a background worker, is what resumes it.
	Lease time.Duration
	// MaxRun bounds one execution, however long its owner keeps renewing:
	// a processor call that never returns must not hold the key for ever.
	// Zero is three leases.
	MaxRun time.Duration
	// Wait is how long a request that finds its key in progress under a
	// live lease waits for the original to finish, to answer with its
	// stored response, before it answers 409 (IDEMPOTENCY_WAIT). Zero, or
	// no Listener, answers 409 at once.
	Wait time.Duration
	// Listener wakes waiting duplicates when their record is notified.
	Listener *Listener
	// Faults, for tests and the demo only; nil in production.
	Faults Faults
}

// NewStore returns a Store over pool.
func NewStore(pool *pgxpool.Pool, cfg StoreConfig, log *slog.Logger) *Store {
	s := &Store{pool: pool, lease: cfg.Lease, maxRun: cfg.MaxRun, wait: cfg.Wait, waiters: cfg.Listener, log: log, faults: cfg.Faults}
	if s.maxRun <= 0 {
		s.maxRun = 3 * s.lease
	}
	if s.waiters == nil {
		s.wait = 0
	}
	return s
}

// CacheReplays keeps the answers of up to size completed records in this
// process, so that their replays need no database round trip; retention
// is IDEMPOTENCY_KEY_RETENTION, which bounds how long an answer may be
// kept (see replays.go for why that makes the cache safe). Call it before
// the Store is used.
func (s *Store) CacheReplays(size int, retention time.Duration) {
	if size > 0 {
		s.replays = newReplayCache(size, retention)
	}
}

// reused is the 422 for a key first used for another request.
func reused(method, path string) *problem.Error {
	return problem.New(problem.IdempotencyKeyReused,
		"this Idempotency-Key was first used for a different request (%s %s, or another body); use a new key for a new operation",
		method, path)
}

// resumable is the answer for an operation that nobody holds any more
// after its owner ran out of time: nothing final was stored, and a retry
// with the same key resumes it at once.
func resumable() *problem.Error {
	p := problem.New(problem.ServiceUnavailable,
		"the operation could not be completed in time; retry with the same Idempotency-Key and it resumes where it stopped")
	p.RetryAfter = 1
	return p
}

func dead() *problem.Error {
	return problem.New(problem.IdempotencyKeyDead,
		"the operation under this Idempotency-Key was set aside for an operator (it failed too often, or the processor gave an answer no retry can change); do not retry it")
}

// cleanupTimeout bounds the writes that wrap up an execution after its
// handler failed. They get their own context because the execution's may be
// the very thing that expired.
const cleanupTimeout = 5 * time.Second

// secondsOf is a number of seconds the database computed, as a Duration.
func secondsOf(seconds float64) time.Duration { return time.Duration(seconds * float64(time.Second)) }
