package idempotency

import (
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction

// Request is one keyed request: who asked for what, under which key.
type Request struct {
	CallerID    string
	Key         string
	Operation   string // the contract's operationId (createCharge), stored with the record
	Method      string
	Path        string
	Fingerprint []byte
}

// RecoveryPoint names a phase boundary an operation has passed, from
// RecoveryStarted to RecoveryFinished (an external operation adds its own).
type RecoveryPoint string

const (
	RecoveryStarted  RecoveryPoint = "started"
	RecoveryFinished RecoveryPoint = "finished"
)

// ErrLeaseLost means a newer attempt took the record over: the phase that
// found out has been rolled back and the caller must stop driving it.
var ErrLeaseLost = errors.New("idempotency: lease lost to a newer attempt")

// ErrDead marks a Step's error (fmt.Errorf("%w: %w", ErrDead, err))
// as one no retry can fix and no final answer may record (the processor
// refusing our downstream key, seen with another request): the record is
// dead at once, left for a person, neither retried in vain nor stored.
var ErrDead = errors.New("idempotency: dead, left for an operator")

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

// Faults are the tests' ways into the engine: the demo and the crash tests
// kill the process where they name, the history check's tests stall an
// owner and plant a bug. Production passes none.
type Faults interface {
	AfterClaim(Record)        // once a claim gave the record, before any work
	AfterPhase(Record)        // once a phase has committed
	BeforeFinalCommit(Record) // a multi-phase operation's last phase: its effect written, not committed
	Unfenced() bool           // completions skip their fence: a PLANTED BUG the history check must catch
}

// StoreConfig tunes a Store.
type StoreConfig struct {
	// Lease is how long an owner holds a record without renewing it
	// (IDEMPOTENCY_LEASE): a crashed owner is noticed within one lease, and
	// a retry or the reconciler takes over. It is also the reconciler's grace
	// after a transient failure, so that the client's own retry resumes it.
	Lease time.Duration
	// MaxRun bounds one execution however long it renews (a hung processor
	// call must not hold the key for ever). Zero is three leases.
	MaxRun time.Duration
	// Wait is how long a request that finds its key in progress under a
	// live lease waits for the original's response before it answers 409
	// (IDEMPOTENCY_WAIT). Zero, or no Listener, answers 409 at once.
	Wait     time.Duration
	Listener *Listener // wakes waiting duplicates
	Faults   Faults    // for tests and the demo only
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

// reused is the 422 for a key first used for another request.
func reused(method, path string) *problem.Error {
	return problem.New(problem.IdempotencyKeyReused,
		"this Idempotency-Key was first used for a different request (%s %s, or another body); use a new key for a new operation",
		method, path)
}

// resumable is the 503 for an operation left unfinished ("now", or "in
// time"): nothing final was stored, and a retry with the same key resumes it.
func resumable(when string) *problem.Error {
	p := problem.New(problem.ServiceUnavailable,
		"the operation could not be completed %s; retry with the same Idempotency-Key and it resumes where it stopped", when)
	p.RetryAfter = 1
	return p
}

func deadAnswer() *problem.Error {
	return problem.New(problem.IdempotencyKeyDead,
		"the operation under this Idempotency-Key was set aside for an operator (it failed too often, or the processor gave an answer no retry can change); do not retry it")
}

// cleanupTimeout bounds the writes wrapping up an execution, on a context of their own (the execution's may have expired).
const cleanupTimeout = 5 * time.Second

// secondsOf is a number of seconds the database computed, as a Duration.
func secondsOf(seconds float64) time.Duration { return time.Duration(seconds * float64(time.Second)) }
