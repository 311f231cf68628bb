package idempotency

import (
	"context"
	"time"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// Record is one caller's idempotency key: the state of one logical
// operation, from its claim to its stored response. Only this package
// writes the idempotency_keys table.
type Record struct {
	ID            int64
	CallerID      string
	Key           string
	Operation     string // the contract's operationId: which Step resumes it
	Status        Status
	RecoveryPoint RecoveryPoint
	// Attempt is the fencing token: it grows with every takeover, and every
	// write its owner makes names the attempt it is made under.
	Attempt     int32
	LockedUntil *time.Time // the lease's end; nil once completed or dead
	// The request it was made for. Only a fingerprint of the body is kept.
	RequestMethod      string
	RequestPath        string
	RequestFingerprint []byte
	// The stored response, once completed.
	ResponseStatus  *int32
	ResponseHeaders []byte
	ResponseBody    []byte
	CreatedAt       time.Time
	UpdatedAt       time.Time
	CompletedAt     *time.Time
	// The reconciler's schedule, and how many of its own tries it has made.
	NextAttemptAt   time.Time
	ReconcilerTries int32
	// Traceparent is the claiming request's W3C trace context, if traced:
	// the reconciler's trace links to it.
	Traceparent string
	Awaited     bool // a duplicate waits, so its completion notifies (wait.go); never unset
}

// Status is where a record stands.
type Status string

// Record statuses.
const (
	StatusInProgress Status = "in_progress"
	StatusCompleted  Status = "completed"
	StatusDead       Status = "dead" // left for an operator
)

func recordOf(r dbsqlc.IdempotencyKey) Record {
	return Record{
		ID: r.ID, CallerID: r.CallerID, Key: r.Key, Operation: r.Operation,
		Status: Status(r.Status), RecoveryPoint: RecoveryPoint(r.RecoveryPoint), Attempt: r.Attempt, LockedUntil: r.LockedUntil,
		RequestMethod: r.RequestMethod, RequestPath: r.RequestPath, RequestFingerprint: r.RequestFingerprint,
		ResponseStatus: r.ResponseStatus, ResponseHeaders: r.ResponseHeaders, ResponseBody: r.ResponseBody,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
		NextAttemptAt: r.NextAttemptAt, ReconcilerTries: r.ReconcilerTries,
		Traceparent: postgres.Text(r.Traceparent), Awaited: r.Awaited,
	}
}

// Get returns the caller's record for key.
func (s *Store) Get(ctx context.Context, callerID, key string) (Record, error) {
	rec, err := queries.GetIdempotencyKey(ctx, s.pool, dbsqlc.GetIdempotencyKeyParams{CallerID: callerID, Key: key})
	return recordOf(rec), postgres.NotFound(err, func() error {
		return problem.New(problem.NotFound, "no idempotency key %q for this caller (it may never have been used, or its retention window has passed)", key)
	})
}

// ListDead returns the caller's dead records, left for an operator, oldest first.
func ListDead(ctx context.Context, db dbsqlc.DBTX, callerID string) (_ []Record, err error) {
	defer postgres.Wrap(&err, "idempotency.ListDead(%s)", callerID)
	rows, err := queries.ListDeadIdempotencyKeys(ctx, db, callerID)
	out := make([]Record, len(rows))
	for i, r := range rows {
		out[i] = recordOf(r)
	}
	return out, err
}
