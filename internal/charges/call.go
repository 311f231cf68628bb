package charges

import (
	"errors"
	"fmt"
	"math"

	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/problem"
)

// What an answer means to an operation. A charge's or a refund's step
// loads its row, calls the processor under the downstream key (outside any
// transaction), classifies the answer, and records only a definite one, in
// the final phase. A new operation that moves money follows the same rules:
//
//   - no definite answer (a timeout, a 5xx, a 429) is never recorded: the
//     client gets a 503 with Retry-After, the record stays at its recovery
//     point, and the next attempt calls again under the same key, which the
//     processor collapses into one effect;
//   - once the processor may have acted, no failure of ours becomes a final
//     answer (the idempotency layer keeps the record resumable);
//   - a processor that refuses the downstream key itself (seen with another
//     request) gives no answer about the money either: the operation is dead
//     at once, left for a person, never recorded as a decline.

// classify reads the processor's answer to the one call of an operation's
// step (retries belong to the API's client and the reconciler: a loop here
// would multiply theirs). A definite answer is for the final phase to
// record: refusal is the processor's definite "no" (a
// *cardprocessor.DeclinedError or RefusedError), nil on success. Anything
// else is stop, for the step to return. what names the operation for the
// client ("charge").
func classify(err error, what string) (refusal, stop error) {
	var uncertain *cardprocessor.UncertainError
	var rejected *cardprocessor.RejectedError
	switch {
	case errors.As(err, &rejected):
		// The processor refuses our key itself: no answer about the
		// customer's money, and no retry can change that.
		return nil, fmt.Errorf("%w: %w", idempotency.ErrDead, err)
	case errors.As(err, &uncertain):
		p := problem.New(problem.ProcessorUnavailable,
			"the card processor did not give a definite answer; retry with the same Idempotency-Key and the %s resumes (it will not happen twice)", what)
		p.RetryAfter = max(1, int(math.Ceil(uncertain.RetryAfter.Seconds())))
		return nil, errors.Join(p, err)
	case err != nil && !cardprocessor.IsDefinite(err):
		// Neither an answer nor a "no". (The idempotency layer keeps any
		// error after the first phase resumable: idempotency.Step.)
		return nil, err
	}
	return err, nil
}
