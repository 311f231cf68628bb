package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/problem"
)

// TestKeyRecordStateMachine checks the key record's state machine against
// a model, on real PostgreSQL: rapid draws random interleavings of what the
// actors around one key can do (three clients and a reconciler claim it;
// whoever holds a lease, current or stale, advances a phase, completes,
// releases, abandons; time passes and leases run out; the sweeper runs),
// and after every step the database must agree with the model. What it
// guards:
//
//   - the record is completed at most once, and its stored response never
//     changes afterwards: every replay is that response, byte for byte;
//   - a phase commits only for the attempt that holds a live lease: a
//     fenced-off or lapsed owner's phase is refused and its writes roll
//     back (the effects table counts exactly the phases the model accepts);
//   - a key whose record was abandoned or swept is free again.
func TestKeyRecordStateMachine(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, time.Minute)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE model_effects (key text NOT NULL, attempt int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	iteration := 0

	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		key := fmt.Sprintf("model-%d", iteration)
		req := testRequest(t, key)
		m := &keyModel{holder: -1}
		const reconciler = 3 // actors 0..2 are clients
		// Each actor's last lease, and which record of the key it was on
		// (abandoning or sweeping a record ends it; a new claim makes
		// another): a lease on an earlier record must never write.
		leases := map[int]*Lease{}
		leaseRecord := map[int]int{}
		// Leave no record of this key for the next iteration's reconciler.
		defer func() {
			if _, err := pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE caller_id = 'acme' AND key = $1`, key); err != nil {
				rt.Fatal(err)
			}
		}()

		effects := func() int {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM model_effects WHERE key = $1`, key).Scan(&n); err != nil {
				rt.Fatal(err)
			}
			return n
		}
		// A phase that writes an effect, so that a refused phase's writes
		// can be seen to roll back.
		phase := func(l *Lease, result Result) error {
			return l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (Result, error) {
				_, err := tx.Exec(ctx, `INSERT INTO model_effects (key, attempt) VALUES ($1, $2)`, key, l.record.Attempt)
				return result, err
			})
		}
		holds := func(actor int) bool {
			l := leases[actor]
			return l != nil && leaseRecord[actor] == m.record && m.exists && m.status == StatusInProgress && m.live && m.holder == actor && l.record.Attempt == m.attempt
		}

		rt.Repeat(map[string]func(*rapid.T){
			"claim": func(rt *rapid.T) {
				actor := rapid.IntRange(0, 2).Draw(rt, "client")
				l, resp, err := s.claim(ctx, req)
				switch {
				case !m.exists:
					if err != nil || l == nil {
						rt.Fatalf("first claim: %v", err)
					}
					*m = keyModel{exists: true, status: StatusInProgress, attempt: 1, holder: actor, live: true, point: string(RecoveryStarted), phases: m.phases, record: m.record + 1}
					leases[actor], leaseRecord[actor] = l, m.record
				case m.status == StatusCompleted:
					if err != nil || resp == nil || resp.Status != http.StatusCreated || !bytes.Equal(resp.Body, m.stored) {
						rt.Fatalf("claim of a completed key: %v, %v; want the replay of %s", resp, err, m.stored)
					}
				case m.live:
					var p *problem.Error
					if !errors.As(asAnswered(err), &p) || p.Code != problem.IdempotencyKeyInUse {
						rt.Fatalf("claim of a held key: %v, %v; want 409 in use", l, err)
					}
				default:
					if err != nil || l == nil || l.record.Attempt != m.attempt+1 || RecoveryPoint(l.record.RecoveryPoint) != RecoveryPoint(m.point) {
						rt.Fatalf("takeover: %+v, %v; want attempt %d at %s", l, err, m.attempt+1, m.point)
					}
					m.attempt, m.holder, m.live = m.attempt+1, actor, true
					leases[actor], leaseRecord[actor] = l, m.record
				}
			},
			"reconcile": func(rt *rapid.T) {
				// Time passes: the record is due on the reconciler's schedule.
				if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET next_attempt_at = now() - interval '1 second' WHERE caller_id = 'acme' AND key = $1`, key); err != nil {
					rt.Fatal(err)
				}
				got, err := s.ClaimStale(ctx, 5, []string{"createOrder"})
				if err != nil {
					rt.Fatal(err)
				}
				want := m.exists && m.status == StatusInProgress && !m.live
				if want != (len(got) == 1) || len(got) > 1 {
					rt.Fatalf("the reconciler claimed %d records; model says stale: %v", len(got), want)
				}
				if want {
					if got[0].record.Attempt != m.attempt+1 {
						rt.Fatalf("reconciler's attempt %d; want %d", got[0].record.Attempt, m.attempt+1)
					}
					m.attempt, m.holder, m.live = m.attempt+1, reconciler, true
					leases[reconciler], leaseRecord[reconciler] = got[0], m.record
				}
			},
			"advance": func(rt *rapid.T) {
				actor := rapid.IntRange(0, 3).Draw(rt, "actor")
				l := leases[actor]
				if l == nil {
					rt.Skip("no lease")
				}
				ok := holds(actor)
				next := RecoveryPoint(fmt.Sprintf("step_%d", m.phases+1))
				err := phase(l, next)
				if ok != (err == nil) || (!ok && !errors.Is(err, ErrLeaseLost)) {
					rt.Fatalf("phase by actor %d (attempt %d; model attempt %d, holder %d, live %v): %v", actor, l.record.Attempt, m.attempt, m.holder, m.live, err)
				}
				if ok {
					m.phases++
					m.point = string(next)
				}
			},
			"complete": func(rt *rapid.T) {
				actor := rapid.IntRange(0, 3).Draw(rt, "actor")
				l := leases[actor]
				if l == nil {
					rt.Skip("no lease")
				}
				ok := holds(actor)
				body := fmt.Appendf(nil, `{"by":%d,"attempt":%d}`, actor, l.record.Attempt)
				err := phase(l, NewResponse(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, body))
				if ok != (err == nil) || (!ok && !errors.Is(err, ErrLeaseLost)) {
					rt.Fatalf("completion by actor %d (attempt %d; model attempt %d, holder %d, live %v, status %s): %v", actor, l.record.Attempt, m.attempt, m.holder, m.live, m.status, err)
				}
				if ok {
					m.phases++
					m.status, m.stored, m.holder, m.live = StatusCompleted, body, -1, false
				}
			},
			"release": func(rt *rapid.T) {
				actor := rapid.IntRange(0, 3).Draw(rt, "actor")
				l := leases[actor]
				if l == nil {
					rt.Skip("no lease")
				}
				l.store.releaseForRetry(l, 0) // as Drive does after a transient failure
				if holds(actor) {
					m.live = false
				}
			},
			"abandon": func(rt *rapid.T) {
				l := leases[reconciler]
				if l == nil {
					rt.Skip("the reconciler holds nothing")
				}
				ok := leaseRecord[reconciler] == m.record && m.exists && m.status == StatusInProgress && l.record.Attempt == m.attempt && m.point == string(RecoveryStarted)
				err := l.deleteUnstarted(ctx)
				if ok != (err == nil) {
					rt.Fatalf("abandon (attempt %d, model %+v): %v", l.record.Attempt, m, err)
				}
				if ok {
					*m = keyModel{holder: -1, phases: m.phases, record: m.record}
				}
			},
			"leaseRunsOut": func(rt *rapid.T) {
				if !m.exists || m.status != StatusInProgress {
					rt.Skip("nothing in progress")
				}
				if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE caller_id = 'acme' AND key = $1`, key); err != nil {
					rt.Fatal(err)
				}
				m.live = false
			},
			"sweep": func(rt *rapid.T) {
				// The retention window passes for this record, and the
				// sweeper runs: only a completed record goes.
				if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 days' WHERE caller_id = 'acme' AND key = $1`, key); err != nil {
					rt.Fatal(err)
				}
				if _, err := queries.SweepIdempotencyKeys(ctx, pool, dbsqlc.SweepIdempotencyKeysParams{RetentionSeconds: (24 * time.Hour).Seconds(), Batch: 100}); err != nil {
					rt.Fatal(err)
				}
				if m.exists && m.status == StatusCompleted {
					*m = keyModel{holder: -1, phases: m.phases, record: m.record}
				}
			},
			"": func(rt *rapid.T) {
				// After every step: the database agrees with the model.
				rec, err := queries.GetIdempotencyKey(ctx, pool, dbsqlc.GetIdempotencyKeyParams{CallerID: "acme", Key: key})
				switch {
				case !m.exists:
					if !errors.Is(err, pgx.ErrNoRows) {
						rt.Fatalf("record %+v (%v); the model has none", rec, err)
					}
				case err != nil:
					rt.Fatal(err)
				default:
					if Status(rec.Status) != m.status || rec.Attempt != m.attempt || rec.RecoveryPoint != m.point && m.status == StatusInProgress {
						rt.Fatalf("record %s attempt %d at %s; model %+v", rec.Status, rec.Attempt, rec.RecoveryPoint, m)
					}
					if m.status == StatusCompleted && !bytes.Equal(rec.ResponseBody, m.stored) {
						rt.Fatalf("stored response %s; model %s", rec.ResponseBody, m.stored)
					}
				}
				if n := effects(); n != m.phases {
					rt.Fatalf("%d phases' effects committed; the model accepted %d", n, m.phases)
				}
			},
		})
	})
}

// keyModel is what the record of one key should be.
type keyModel struct {
	exists  bool
	status  Status
	attempt int32
	point   string
	holder  int  // the actor whose lease is current (-1: none)
	live    bool // whether that lease is still running
	stored  []byte
	phases  int // phases committed for this key, over every record it had
	record  int // which record of the key this is: 1 for the first, and so on
}
