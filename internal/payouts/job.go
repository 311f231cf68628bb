package payouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/metrics"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/retry"
)

// JobArgs names the payout a job carries out; all else it needs is in the
// payout's row, written when it was accepted.
type JobArgs struct {
	CallerID string `json:"caller_id"`
	PayoutID string `json:"payout_id"`
	// Traceparent is the trace context of the request that accepted the
	// payout (postgres.Traceparent), or "": only each run's trace link
	// (startJob) depends on it.
	Traceparent string `json:"traceparent,omitempty"`
}

// Kind is the job's kind in River's tables.
func (JobArgs) Kind() string { return "payout" }

// InsertOpts: enough attempts to ride out a processor outage of hours (see
// NextRetry). River discards a job that still fails; one the processor keeps
// telling to wait cancels itself (Worker.giveUp). `server dead-letters` lists
// both: the payout stays pending or in transit, its money held.
func (JobArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 200} }

// Worker runs payout jobs.
type Worker struct {
	river.WorkerDefaults[JobArgs]
	db          *pgxpool.Pool
	processor   cardprocessor.Processor
	timeout     time.Duration
	giveUpAfter time.Duration
	log         *slog.Logger
}

// NewWorker returns a Worker that pays out through processor. timeout bounds
// one run (a processor call, two short transactions); giveUpAfter sets aside
// a job without a definite answer for that long (PAYOUT_GIVE_UP_AFTER).
func NewWorker(db *pgxpool.Pool, processor cardprocessor.Processor, timeout, giveUpAfter time.Duration, log *slog.Logger) *Worker {
	return &Worker{db: db, processor: processor, timeout: timeout, giveUpAfter: giveUpAfter, log: log}
}

// Timeout bounds one run; River cancels a longer one and retries it.
func (w *Worker) Timeout(*river.Job[JobArgs]) time.Duration { return w.timeout }

// NextRetry is capped exponential backoff with full jitter: a random wait up
// to 1s, 2s, 4s, … at most a minute. River's default (attempt⁴ seconds)
// waits an hour by the eighth attempt, far too long for a processor blip.
func (w *Worker) NextRetry(job *river.Job[JobArgs]) time.Time {
	return time.Now().Add(retry.FullJitter(time.Second, time.Minute, job.Attempt-1) + 100*time.Millisecond)
}

// Work takes the payout one step: pending to in transit (asking for the
// transfer), or in transit to final (asking where it is). Between steps it
// snoozes, not a failed attempt: a slow transfer never uses up attempts.
func (w *Worker) Work(ctx context.Context, job *river.Job[JobArgs]) (err error) {
	ctx, span := startJob(ctx, job)
	defer func() { endJob(span, err) }()
	po, err := queries.GetPayout(ctx, w.db, dbsqlc.GetPayoutParams{CallerID: job.Args.CallerID, ID: job.Args.PayoutID})
	if err != nil {
		return fmt.Errorf("load payout %s: %w", job.Args.PayoutID, err)
	}
	switch Status(po.Status) {
	case StatusPaid, StatusFailed:
		return nil // final: recorded by an earlier run, or by a webhook
	case StatusPending:
		return w.start(ctx, job, po)
	case StatusInTransit:
		return w.follow(ctx, job, po)
	}
	return fmt.Errorf("payout %s has unknown status %q", po.ID, po.Status)
}

// start asks for the transfer outside any transaction, under the payout's
// downstream key: if a run dies after the processor acted (crash point
// after_processor_call), the next run's call replays the first answer.
func (w *Worker) start(ctx context.Context, job *river.Job[JobArgs], po dbsqlc.Payout) error {
	res, err := w.processor.Payout(ctx, po.DownstreamKey,
		cardprocessor.PayoutRequest{Amount: po.Amount, Currency: po.Currency, Destination: po.Destination})
	switch {
	case cardprocessor.IsDefinite(err):
		// A definite "no": no transfer was started.
		return w.record(ctx, po, Answer{FailureCode: cardprocessor.RefusalCode(err)})
	case errors.As(err, new(*cardprocessor.RejectedError)):
		// The processor refuses our key itself: no run of this job can get
		// an answer about the money. A person must look; the money stays
		// held meanwhile (never restored on a guess).
		return w.giveUp(ctx, po, err)
	case err != nil && time.Since(job.CreatedAt) > w.giveUpAfter:
		// Snoozes do not use up River's attempts: without this bound, a
		// processor answering 429 or 503 with a long Retry-After would keep
		// the job waiting for ever.
		return w.giveUp(ctx, po, fmt.Errorf("no definite answer from the processor after %s: %w", w.giveUpAfter, err))
	case err != nil:
		// No definite answer: River runs the job again after NextRetry (or
		// the processor's Retry-After), asking again under the same key.
		if uncertain, ok := errors.AsType[*cardprocessor.UncertainError](err); ok && uncertain.RetryAfter > time.Second {
			return river.JobSnooze(uncertain.RetryAfter)
		}
		return err
	}
	if res.Status != cardprocessor.PayoutInTransit {
		return w.record(ctx, po, reported(res)) // already final: a replayed transfer, arrived since
	}
	arrives := time.Unix(res.ArrivalDate, 0)
	_, err = queries.SetPayoutInTransit(ctx, w.db,
		dbsqlc.SetPayoutInTransitParams{CallerID: po.CallerID, ID: po.ID, ProcessorPayoutID: &res.ID, ArrivesAt: &arrives})
	if err != nil && !postgres.IsNotFound(err) { // not found: a webhook recorded the outcome meanwhile
		return err
	}
	return river.JobSnooze(untilArrival(arrives))
}

// follow asks the processor where the transfer is, and records it once final.
func (w *Worker) follow(ctx context.Context, job *river.Job[JobArgs], po dbsqlc.Payout) error {
	if po.ProcessorPayoutID == nil {
		return fmt.Errorf("payout %s is in transit without a processor payout id", po.ID)
	}
	res, err := w.processor.GetPayout(ctx, *po.ProcessorPayoutID)
	if err != nil {
		return err
	}
	if res.Status == cardprocessor.PayoutInTransit {
		// A transfer may take days; one in transit long after its
		// expected arrival is a failure.
		arrives := time.Unix(res.ArrivalDate, 0)
		if time.Since(arrives) > w.giveUpAfter {
			return w.giveUp(ctx, po, fmt.Errorf("still in transit %s after its expected arrival (%s)", w.giveUpAfter, arrives.UTC().Format(time.RFC3339)))
		}
		return river.JobSnooze(untilArrival(arrives))
	}
	return w.record(ctx, po, reported(res))
}

// giveUp sets the job aside: River cancels it, `server dead-letters` lists
// it. The payout keeps its status and its money stays held: only a person,
// reading the processor's records, can say where the money is.
func (w *Worker) giveUp(ctx context.Context, po dbsqlc.Payout, reason error) error {
	w.log.ErrorContext(ctx, "payout job set aside for an operator", "caller", po.CallerID, "payout", po.ID, "status", po.Status, "err", reason)
	metrics.DeadLetters.WithLabelValues(metrics.DeadLetterPayoutJob).Inc()
	return river.JobCancel(reason)
}

// record writes how the payout ended, in a transaction of its own.
func (w *Worker) record(ctx context.Context, po dbsqlc.Payout, o Answer) error {
	return postgres.Transact(ctx, w.db, func(tx pgx.Tx) error { return settle(ctx, tx, po, o) })
}

// reported is the final status the processor reported, as an Answer.
func reported(res cardprocessor.PayoutResult) Answer {
	return Answer{Paid: res.Status == cardprocessor.PayoutPaid, ProcessorPayoutID: res.ID, FailureCode: postgres.Text(res.FailureCode)}
}

// untilArrival is how long to snooze: until the expected arrival, at least
// a quarter second (the processor's clock is in whole seconds), at most a
// minute.
func untilArrival(arrives time.Time) time.Duration {
	return min(time.Minute, max(250*time.Millisecond, time.Until(arrives)))
}

// JobsConfig configures the River client that carries payout jobs.
type JobsConfig struct {
	Workers int // payout jobs run at once in this process; 0: insert-only (do not Start)
	// JobTimeout bounds one run; RescueAfter (longer) is how long a job may
	// run before River deems its process dead and runs it again.
	JobTimeout, RescueAfter time.Duration
	// FetchPollInterval is how often an idle client looks for snoozed or
	// retried jobs come due (zero: River's 1s); new ones come by LISTEN/NOTIFY.
	FetchPollInterval time.Duration
	Logger            *slog.Logger
}

// NewJobs returns the River client for payout jobs, on postgres.RiverSchema.
// It inserts jobs (InsertTx), and runs them with worker once started when
// cfg.Workers > 0.
func NewJobs(pool *pgxpool.Pool, worker *Worker, cfg JobsConfig) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	rc := &river.Config{Schema: postgres.RiverSchema, Workers: workers, JobTimeout: cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueAfter, FetchPollInterval: cfg.FetchPollInterval, Logger: cfg.Logger}
	if cfg.Workers > 0 {
		rc.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.Workers}}
	}
	return river.NewClient(riverpgxv5.New(pool), rc)
}

// GivenUpJob is a payout job given up on: discarded by River (out of
// attempts) or cancelled by itself (Worker.giveUp).
type GivenUpJob struct {
	JobID       int64
	CallerID    string
	PayoutID    string
	Attempts    int16
	State       string // discarded or cancelled
	Reason      string // the last of the job's errors
	FinalizedAt *time.Time
}

// ListGivenUpJobs returns every payout job given up on, oldest first. The
// queue is not tenant data, so this reads every caller's.
func ListGivenUpJobs(ctx context.Context, db dbsqlc.DBTX) (_ []GivenUpJob, err error) {
	defer postgres.Wrap(&err, "ListGivenUpJobs")
	rows, err := queries.ListDiscardedPayoutJobs(ctx, db)
	out := make([]GivenUpJob, len(rows))
	for i, j := range rows {
		var args JobArgs
		if err := json.Unmarshal(j.Args, &args); err != nil {
			return nil, fmt.Errorf("payout job %d: %w", j.ID, err)
		}
		out[i] = GivenUpJob{JobID: j.ID, CallerID: args.CallerID, PayoutID: args.PayoutID,
			Attempts: j.Attempt, State: j.State, Reason: j.LastError, FinalizedAt: j.FinalizedAt}
	}
	return out, err
}
