// Package payouts pays money out of a caller's balance to a bank account:
// the long-running half of the idempotency pattern. A payout takes seconds
// to days, so no request waits for it:
//
//	POST /v1/payouts   one transaction (a local operation): debit the balance
//	                   (the database refuses an overdraw), create the payout
//	                   (pending) with its downstream key, enqueue its River
//	                   job, store the key's 202. "Accepted" and "will run"
//	                   commit together or not at all.
//	the job (Worker)   pending → ask for the transfer under the downstream
//	                   key → in_transit → follow it, snoozing, until the
//	                   processor says paid or failed.
//	GET /v1/payouts/…  the payout now, with a Retry-After hint until final.
//
// A retried POST replays the stored 202; the client polls its Location. The
// job may run more than once per step (River retries it after an error or a
// timeout, and rescues it after its process died): every run sends the same
// downstream key, so the processor makes one transfer, and every write is
// conditional on the payout's status, so a late run changes nothing recorded.
package payouts

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/events"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/ledger"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

// Status is where a payout stands.
type Status string

const (
	StatusPending   Status = "pending"
	StatusInTransit Status = "in_transit"
	StatusPaid      Status = "paid"
	StatusFailed    Status = "failed"
)

// Payout is a payout as the rest of the service sees it.
type Payout struct {
	ID          string
	CallerID    string
	Amount      int64 // in the currency's minor unit
	Currency    string
	Destination string
	Status      Status
	FailureCode *string
	ArrivesAt   *time.Time // when the processor expects it, once in transit
	CreatedAt   time.Time
}

// API is the payout as the contract shows it (see orders.Order.API for why
// it is built here).
func (p Payout) API() apigen.Payout {
	return apigen.Payout{Id: p.ID, Amount: p.Amount, Currency: apigen.Currency(p.Currency), Destination: p.Destination,
		Status: apigen.PayoutStatus(p.Status), FailureCode: p.FailureCode, CreatedAt: p.CreatedAt}
}

// Accepted is the stored and replayed answer to a payout request: 202, the
// payout as created, and where to poll it.
func (p Payout) Accepted() (*idempotency.Response, error) {
	return idempotency.JSONResponse(http.StatusAccepted, http.Header{"Location": {"/v1/payouts/" + p.ID}}, p.API())
}

// PollAfter is the Retry-After hint, in seconds: 0 for a final payout; 1
// for a pending one, whose job is about to run; for one in transit, the time
// until its expected arrival, between 1 and 60.
func (p Payout) PollAfter(now time.Time) int {
	switch {
	case p.Status == StatusInTransit && p.ArrivesAt != nil:
		return min(60, max(1, int(math.Ceil(p.ArrivesAt.Sub(now).Seconds()))))
	case p.Status == StatusPending || p.Status == StatusInTransit:
		return 1
	}
	return 0
}

func payoutOf(r dbsqlc.Payout) Payout {
	return Payout{ID: r.ID, CallerID: r.CallerID, Amount: r.Amount, Currency: r.Currency, Destination: r.Destination,
		Status: Status(r.Status), FailureCode: r.FailureCode, ArrivesAt: r.ArrivesAt, CreatedAt: r.CreatedAt}
}

// DefaultDestination is the test bank account paid when none is named.
const DefaultDestination = "ba_test_ok"

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

var newPayoutID = postgres.IDs("po") // po_…

// Request is what a caller asks for: the body of POST /v1/payouts.
type Request struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"` // DefaultDestination when not given
}

// An Enqueuer inserts a job in a transaction: River's client.
type Enqueuer interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// Service accepts payouts.
type Service struct {
	jobs Enqueuer
}

// NewService returns a Service that enqueues payout jobs with jobs.
func NewService(jobs Enqueuer) *Service { return &Service{jobs: jobs} }

// Operation declares createPayout, POST /v1/payouts: a local operation that
// only accepts the payout. The job does the rest.
func (s *Service) Operation() idempotency.Operation {
	return idempotency.Local("createPayout", s.accept)
}

// accept debits the balance, creates the payout and enqueues its job in tx.
func (s *Service) accept(ctx context.Context, tx pgx.Tx, in idempotency.Input[Request]) (*idempotency.Response, error) {
	req := in.Body
	// Its downstream key is derived from the request, not the row
	// (cardprocessor.DownstreamKey): a retry after a failover that lost this
	// transaction gets the same transfer. The insert checks it is free.
	var po dbsqlc.Payout
	err := pgx.ErrNoRows
	for generation := 0; postgres.IsNotFound(err); generation++ {
		po, err = queries.CreatePayout(ctx, tx, dbsqlc.CreatePayoutParams{CallerID: in.CallerID, ID: newPayoutID(),
			Amount: req.Amount, Currency: req.Currency, Destination: cmp.Or(req.Destination, DefaultDestination),
			DownstreamKey: cardprocessor.DownstreamKey(in.CallerID, in.Key, in.Fingerprint, generation)})
	}
	if err != nil {
		return nil, err
	}
	// The transactional enqueue: the job row commits with the payout and
	// the stored 202, or none of them does.
	if _, err := s.jobs.InsertTx(ctx, tx, JobArgs{CallerID: po.CallerID, PayoutID: po.ID, Traceparent: postgres.Text(postgres.Traceparent(ctx))}, nil); err != nil {
		return nil, fmt.Errorf("enqueue payout job: %w", err)
	}
	// The debit last: it locks the caller's balance until the commit. A
	// refusal (stored and replayed like a decline) aborts tx, and the
	// idempotency layer stores the problem in a transaction of its own.
	if err := ledger.Debit(ctx, tx, in.CallerID, req.Currency, req.Amount, po.ID); err != nil {
		return nil, err
	}
	return payoutOf(po).Accepted()
}

// Get returns the caller's payout id.
func Get(ctx context.Context, db dbsqlc.DBTX, callerID, id string) (_ Payout, err error) {
	defer postgres.Wrap(&err, "payouts.Get(%s, %q)", callerID, id)
	po, err := queries.GetPayout(ctx, db, dbsqlc.GetPayoutParams{CallerID: callerID, ID: id})
	return payoutOf(po), postgres.NotFound(err, func() error { return problem.New(problem.NotFound, "no payout %q", id) })
}

// List returns up to limit of the caller's payouts, newest first, after
// the payout startingAfter when it is not empty, and whether more exist.
func List(ctx context.Context, db dbsqlc.DBTX, callerID string, limit int, startingAfter string) (_ []Payout, _ bool, err error) {
	defer postgres.Wrap(&err, "payouts.List(%s)", callerID)
	return postgres.Page(limit, startingAfter, "payout of yours",
		func(id string) (postgres.Cursor, error) {
			po, err := queries.GetPayout(ctx, db, dbsqlc.GetPayoutParams{CallerID: callerID, ID: id})
			return postgres.Cursor{CreatedAt: po.CreatedAt, ID: po.ID}, err
		},
		func(c postgres.Cursor, rowLimit int32) ([]dbsqlc.Payout, error) {
			return queries.ListPayouts(ctx, db, dbsqlc.ListPayoutsParams{CallerID: callerID, RowLimit: rowLimit,
				HasCursor: c.Set, CursorCreatedAt: c.CreatedAt, CursorID: c.ID})
		}, payoutOf)
}

// ApplyPayoutEvent is the inbox's Applier for payout.paid and
// payout.failed, about the payout made under the event's downstream key. It
// agrees with the job, which polls for the same outcome: whichever comes
// first records it, the other finds it recorded.
func ApplyPayoutEvent(ctx context.Context, tx pgx.Tx, callerID string, ev events.ProcessorEvent) (_ bool, err error) {
	defer postgres.Wrap(&err, "payouts.ApplyPayoutEvent(%s, %q)", callerID, ev.DownstreamKey)
	o := Answer{Paid: ev.Type == events.ProcessorPayoutPaid, ProcessorPayoutID: ev.ObjectID, FailureCode: postgres.Text(ev.FailureCode),
		Report: events.Report{Amount: ev.Amount, Currency: ev.Currency, ProcessorID: ev.ObjectID}}
	po, err := queries.GetPayoutByDownstreamKey(ctx, tx, dbsqlc.GetPayoutByDownstreamKeyParams{CallerID: callerID, DownstreamKey: ev.DownstreamKey})
	if postgres.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	err = settle(ctx, tx, po, o)
	return err == nil, err
}

// Answer is the processor's definite answer about a payout: how it ended.
type Answer struct {
	Paid              bool
	FailureCode       string // when not Paid
	ProcessorPayoutID string
	Report            events.Report // what a webhook said besides, checked against the payout
}

// settle moves a payout that is not final to its outcome, with the balance
// and the event. It locks the row and decides on what it finds: a payout
// already at that outcome is left alone; one at the other is a
// contradiction, changed by nobody.
func settle(ctx context.Context, tx pgx.Tx, po dbsqlc.Payout, o Answer) error {
	cur, err := queries.LockPayout(ctx, tx, dbsqlc.LockPayoutParams{CallerID: po.CallerID, ID: po.ID})
	if err != nil {
		return err
	}
	if err := o.Report.Check("payout", cur.ID, cur.Amount, cur.Currency, cur.ProcessorPayoutID); err != nil {
		return err
	}
	want := StatusFailed
	if o.Paid {
		want = StatusPaid
	}
	switch Status(cur.Status) {
	case want:
		return nil // recorded already
	case StatusPending, StatusInTransit:
	default:
		return &events.ContradictionError{Object: "payout", ID: cur.ID, Field: "status", Recorded: cur.Status, Reported: string(want)}
	}
	data := map[string]any{"payout_id": cur.ID, "amount": cur.Amount, "currency": cur.Currency, "destination": cur.Destination}
	if o.Paid {
		if cur, err = queries.SetPayoutPaid(ctx, tx, dbsqlc.SetPayoutPaidParams{CallerID: cur.CallerID, ID: cur.ID, ProcessorPayoutID: postgres.Nullable(o.ProcessorPayoutID)}); err != nil {
			return err
		}
		if err := ledger.Settle(ctx, tx, cur.CallerID, cur.Currency, cur.Amount, cur.ID); err != nil {
			return err
		}
		return events.Emit(ctx, tx, cur.CallerID, events.PayoutPaid, data)
	}
	code := cmp.Or(o.FailureCode, "payout_failed") // when the processor gave no reason
	if cur, err = queries.SetPayoutFailed(ctx, tx, dbsqlc.SetPayoutFailedParams{CallerID: cur.CallerID, ID: cur.ID, FailureCode: &code, ProcessorPayoutID: postgres.Nullable(o.ProcessorPayoutID)}); err != nil {
		return err
	}
	// The money did not leave: it is available again.
	if err := ledger.Restore(ctx, tx, cur.CallerID, cur.Currency, cur.Amount, cur.ID); err != nil {
		return err
	}
	data["failure_code"] = code
	return events.Emit(ctx, tx, cur.CallerID, events.PayoutFailed, data)
}
