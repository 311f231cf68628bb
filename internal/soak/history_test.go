package soak

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/retrysafe/payments/client/apiclient"
)

// The soak's other checks look at the end state: what every key answers
// once everything has settled, and whether every final answer a client got
// is found again there. The history check looks at every answer the
// moment it was given. Each keyed HTTP request a soak sends (every attempt
// of the project's client, a hung-up client's too, and the final replays)
// is one operation of a history, with when it was sent and when its
// answer came back; porcupine then decides whether some order of all of
// them, each placed between its sending and its answer, is one the
// contract allows (linearizability). A key whose first answer was given
// before another's completion, a completion after a replay, two different
// answers: each breaks every such order.
//
// The contract, per caller and key (a partition: keys never interact, so
// each is checked on its own, and the check stays fast):
//
//   - The first completed outcome wins. A final answer (every answer but
//     the transient ones, see transient) that is not a replay is the
//     completion: there is at most one, and none after any final answer.
//   - Every later final answer for the same fingerprint is a replay, equal
//     to the first byte for byte (status and body).
//   - A different fingerprint gets a 422 idempotency_key_reused once the
//     key has an outcome (before that, another body may hold the key in
//     flight: a 422 is allowed then too).
//   - A 409 idempotency_key_in_use only while the key has no outcome yet.
//   - A transient answer (503, 429, ...) says nothing: nothing was stored.
//     No answer at all (a timeout, a dropped connection, a client that hung
//     up) may or may not have happened: its answer time is infinity, and
//     the model accepts it anywhere. (Had it completed the key, the first
//     replay anyone saw would carry its outcome; the model lets that
//     replay set it, so an unseen completion never needs modelling.)

// historyOp is one keyed HTTP request and its answer.
type historyOp struct {
	caller, key string
	fingerprint string    // a hash of the method, path and body
	call, ret   time.Time // ret is zero when no answer came
	status      int       // 0: no answer (the outcome is unknown)
	code        string    // the problem's code, for a problem
	body        string    // a hash of the answer's body
	replayed    bool
	replica     string
	// check marks the final replays of checkReplays: not a client's
	// request, and not counted in the time to a final answer.
	check bool
}

// outcome is how the contract reads an answer.
type outcome int

const (
	noAnswer    outcome = iota // no answer: may or may not have happened
	transient                  // nothing stored: the client tries again
	inFlight                   // 409 idempotency_key_in_use
	mismatch                   // 422 idempotency_key_reused
	setAside                   // 409 idempotency_key_dead: answered afresh every time, never stored
	finalAnswer                // the key's outcome, or a replay of it
)

// outcomeOf classifies an answer as the soak's final (in soak_test.go)
// does: the answers the project's client retries are not final.
func outcomeOf(status int, code string) outcome {
	switch {
	case status == 0:
		return noAnswer
	case status == http.StatusConflict && code == string(apiclient.ProblemCodeIdempotencyKeyInUse):
		return inFlight
	case retried(status, code):
		return transient
	case status == http.StatusUnprocessableEntity && code == string(apiclient.ProblemCodeIdempotencyKeyReused):
		return mismatch
	case status == http.StatusConflict && code == string(apiclient.ProblemCodeIdempotencyKeyDead):
		return setAside
	}
	return finalAnswer
}

// retried says whether the project's client retries an answer (after a
// 409, only idempotency_key_in_use): nothing final was stored.
func retried(status int, code string) bool {
	switch status {
	case http.StatusConflict:
		return code == string(apiclient.ProblemCodeIdempotencyKeyInUse)
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// record starts a history operation for req, a request of the soak's
// clients; nil for a request without an Idempotency-Key. It reads the body
// (and puts it back) for the fingerprint.
func (s *soak) record(req *http.Request) *historyOp {
	key := req.Header.Get("Idempotency-Key")
	if key == "" {
		return nil
	}
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	return &historyOp{
		// The soak's API keys are sk_test_<caller>; the history names the
		// caller, never the secret.
		caller:      strings.TrimPrefix(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "), "sk_test_"),
		key:         key,
		fingerprint: shortHash([]byte(req.Method + " " + req.URL.Path + "\n" + string(body))),
		replica:     req.URL.Host,
		call:        time.Now(),
	}
}

// answered completes h with the answer res (nil: none came) and its body,
// and adds it to the history.
func (s *soak) answered(h *historyOp, res *http.Response, body []byte) {
	h.ret = time.Now()
	if res != nil {
		h.status, h.replayed, h.body = res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", shortHash(body)
		if res.StatusCode >= 300 {
			var p struct{ Code string }
			_ = json.Unmarshal(body, &p)
			h.code = p.Code
		}
	}
	s.mu.Lock()
	s.history = append(s.history, *h)
	s.mu.Unlock()
}

func shortHash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// The model's input, output and state.
type (
	contractInput struct {
		fingerprint string
	}
	contractOutput struct {
		outcome    outcome
		status     int
		code, body string
		replayed   bool
	}
	// contractState is the key's outcome: none yet, or the fingerprint
	// that completed it and its answer, or set aside for an operator.
	contractState struct {
		done, dead  bool
		fingerprint string
		status      int
		body        string
	}
)

// contract is the sequential model of one key (a partition).
var contract = porcupine.Model{
	Init: func() any { return contractState{} },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(contractState), input.(contractInput), output.(contractOutput)
		switch out.outcome {
		case noAnswer, transient:
			return true, st
		case inFlight:
			return !st.done, st
		case mismatch:
			return !st.done || st.fingerprint != in.fingerprint, st
		case setAside:
			// A record set aside stays so; its answer is made afresh for
			// every request, so only its status and code are compared.
			return !st.done || (st.dead && st.fingerprint == in.fingerprint), contractState{done: true, dead: true, fingerprint: in.fingerprint}
		}
		if !st.done {
			return true, contractState{done: true, fingerprint: in.fingerprint, status: out.status, body: out.body}
		}
		// Only a replay may follow the outcome, of the same request, with
		// the same answer.
		return !st.dead && out.replayed && st.fingerprint == in.fingerprint && st.status == out.status && st.body == out.body, st
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(contractInput), output.(contractOutput)
		var answer string
		switch out.outcome {
		case noAnswer:
			answer = "no answer (unknown)"
		default:
			answer = fmt.Sprintf("%d %s", out.status, out.code)
			if out.outcome == finalAnswer {
				answer += " body " + out.body
				if out.replayed {
					answer += " (replay)"
				} else {
					answer += " (new)"
				}
			}
		}
		return fmt.Sprintf("%s → %s", in.fingerprint, answer)
	},
	DescribeState: func(state any) string {
		st := state.(contractState)
		switch {
		case !st.done:
			return "no outcome yet"
		case st.dead:
			return "set aside (dead)"
		}
		return fmt.Sprintf("outcome: %s → %d body %s", st.fingerprint, st.status, st.body)
	},
	DescribeOperationMetadata: func(info any) string {
		if info == nil {
			return ""
		}
		return info.(string)
	},
}

// historyResult is what checkHistory found.
type historyResult struct {
	operations, unknown, partitions int
	illegal                         []string // the partitions (caller/key) that are not linearizable
	undecided                       []string // those the checker could not decide in time
	files                           []string // their visualisations
	firstIllegal                    []historyOp
	took                            time.Duration
	// The time from a key's first request to its first final answer, for
	// every key that has one.
	finalAnswers []time.Duration
}

// partitionTimeout bounds the check of one partition. A key has a few
// dozen operations at most, checked in microseconds; a partition that
// takes this long is reported, not taken as passed.
const partitionTimeout = 30 * time.Second

// checkHistory checks every partition of history against the contract. For
// each one that is not linearizable, it writes porcupine's visualisation
// to dir (made on first use when empty).
func checkHistory(history []historyOp, dir string) (historyResult, error) {
	began := time.Now()
	res := historyResult{operations: len(history)}
	if len(history) == 0 {
		return res, nil
	}
	// porcupine wants integer times: nanoseconds since the first request.
	base := slices.MinFunc(history, func(a, b historyOp) int { return a.call.Compare(b.call) }).call
	partitions := map[string][]historyOp{}
	for _, h := range history {
		k := h.caller + "/" + h.key
		partitions[k] = append(partitions[k], h)
		if h.status == 0 {
			res.unknown++
		}
	}
	res.partitions = len(partitions)
	for _, name := range slices.Sorted(maps.Keys(partitions)) {
		part := partitions[name]
		slices.SortFunc(part, func(a, b historyOp) int { return a.call.Compare(b.call) })
		ops := make([]porcupine.Operation, len(part))
		lanes := []time.Time{} // when each visualisation row is free again
		for i, h := range part {
			ret := int64(math.MaxInt64) // no answer: it may take effect at any time after it was sent
			if h.status != 0 {
				ret = int64(h.ret.Sub(base))
			}
			// A row of the visualisation per client that is not busy:
			// the first lane free when this request was sent.
			lane := slices.IndexFunc(lanes, func(free time.Time) bool { return !free.IsZero() && free.Before(h.call) })
			if lane < 0 {
				lane = len(lanes)
				lanes = append(lanes, time.Time{})
			}
			lanes[lane] = h.ret // zero (never free) when no answer came
			ops[i] = porcupine.Operation{
				ClientId: lane,
				Input:    contractInput{fingerprint: h.fingerprint},
				Call:     int64(h.call.Sub(base)),
				Output:   contractOutput{outcome: outcomeOf(h.status, h.code), status: h.status, code: h.code, body: h.body, replayed: h.replayed},
				Return:   ret,
				Metadata: fmt.Sprintf("%s, sent %s%s", h.replica, h.call.Format("15:04:05.000"), map[bool]string{true: ", final check", false: ""}[h.check]),
			}
		}
		res.finalAnswers = appendFinalAnswer(res.finalAnswers, part)
		switch porcupine.CheckOperationsTimeout(contract, ops, partitionTimeout) {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			res.undecided = append(res.undecided, name)
			continue
		}
		res.illegal = append(res.illegal, name)
		if res.firstIllegal == nil {
			res.firstIllegal = part
		}
		_, info := porcupine.CheckOperationsVerbose(contract, ops, partitionTimeout)
		if dir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "soak-history-"); err != nil {
				return res, err
			}
		}
		file := filepath.Join(dir, "history-"+unsafeChars.ReplaceAllString(name, "_")+".html")
		if err := porcupine.VisualizePath(contract, info, file); err != nil {
			return res, err
		}
		res.files = append(res.files, file)
	}
	res.took = time.Since(began)
	return res, nil
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// appendFinalAnswer adds how long the key of part took to its first final
// answer, from its first request: what a client waits, retries, 409s and
// outages included. The final check's replays are not a client's.
func appendFinalAnswer(times []time.Duration, part []historyOp) []time.Duration {
	var first, answered time.Time
	for _, h := range part {
		if h.check {
			continue
		}
		if first.IsZero() || h.call.Before(first) {
			first = h.call
		}
		if outcomeOf(h.status, h.code) == finalAnswer && (answered.IsZero() || h.ret.Before(answered)) {
			answered = h.ret
		}
	}
	if first.IsZero() || answered.IsZero() {
		return times
	}
	return append(times, answered.Sub(first))
}

// percentile is the nearest-rank p-th percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(ds))
	return sorted[max(0, int(math.Ceil(p/100*float64(len(sorted))))-1)]
}

// String describes a history operation, for a log.
func (h historyOp) String() string {
	answer := "no answer"
	if h.status != 0 {
		answer = fmt.Sprintf("%s: %d %s body %s replayed %v", h.ret.Format("15:04:05.000"), h.status, h.code, h.body, h.replayed)
	}
	return fmt.Sprintf("%s %s on %s, sent %s, fingerprint %s; %s", h.caller, h.key, h.replica, h.call.Format("15:04:05.000"), h.fingerprint, answer)
}

// lines are the report's lines for a history check.
func (r historyResult) lines() []string {
	verdict := "linearizable"
	if len(r.illegal) > 0 || len(r.undecided) > 0 {
		verdict = fmt.Sprintf("%d NOT linearizable, %d undecided", len(r.illegal), len(r.undecided))
	}
	return []string{
		fmt.Sprintf("history             %d operations (%d without an answer) in %d partitions (caller, key): %s, checked in %s",
			r.operations, r.unknown, r.partitions, verdict, r.took.Round(time.Millisecond)),
		fmt.Sprintf("to a final answer   p99 %s, max %s (%d keys, first request to first final answer)",
			percentile(r.finalAnswers, 99).Round(10*time.Millisecond), slices.Max(append([]time.Duration{0}, r.finalAnswers...)).Round(10*time.Millisecond), len(r.finalAnswers)),
	}
}

// TestContractModel checks the model on small histories of one key, each
// written as the soak would record it: what it must accept, and what it
// must refuse. (The soaks check it on real ones, and
// TestHistoryCheckFindsUnfencedCompletion on one with a planted bug.)
func TestContractModel(t *testing.T) {
	t.Parallel()
	at := time.Now()
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	// op is a request sent at from ms and answered at to ms (to < 0: no
	// answer) with status, body and whether it was a replay.
	op := func(fp string, from, to, status int, code, body string, replayed bool) historyOp {
		h := historyOp{caller: "acme", key: "k", fingerprint: fp, call: ms(from), status: status, code: code, body: body, replayed: replayed}
		if to >= 0 {
			h.ret = ms(to)
		} else {
			h.status = 0
		}
		return h
	}
	inUse, reused := string(apiclient.ProblemCodeIdempotencyKeyInUse), string(apiclient.ProblemCodeIdempotencyKeyReused)
	for _, c := range []struct {
		name    string
		ok      bool
		history []historyOp
	}{
		{"one completion, then replays", true, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("a", 20, 30, 201, "", "x", true), op("a", 40, 50, 201, "", "x", true)}},
		{"a replay overlapping the completion", true, []historyOp{
			op("a", 0, 30, 201, "", "x", false), op("a", 10, 20, 201, "", "x", true)}},
		{"a 409 while it could be in flight, 503s anywhere", true, []historyOp{
			op("a", 0, 30, 201, "", "x", false), op("a", 5, 25, 409, inUse, "p", false), op("a", 40, 50, 503, "service_unavailable", "q", false)}},
		{"no answer, then a replay of what it did", true, []historyOp{
			op("a", 0, -1, 0, "", "", false), op("a", 20, 30, 201, "", "x", true)}},
		{"another body gets 422", true, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("b", 20, 30, 422, reused, "r", false)}},
		{"set aside, and so for every request", true, []historyOp{
			op("a", 0, 10, 409, "idempotency_key_dead", "d1", false), op("a", 20, 30, 409, "idempotency_key_dead", "d2", false)}},

		{"two different answers", false, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("a", 20, 30, 201, "", "y", true)}},
		{"two completions with the same answer", false, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("a", 20, 30, 201, "", "x", false)}},
		{"a replay before the completion began", false, []historyOp{
			op("a", 0, 10, 201, "", "x", true), op("a", 20, 30, 201, "", "x", false)}},
		{"a 409 after the outcome was given", false, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("a", 20, 30, 409, inUse, "p", false)}},
		{"another body replayed instead of a 422", false, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("b", 20, 30, 201, "", "x", true)}},
		{"the same body refused as another's", false, []historyOp{
			op("a", 0, 10, 201, "", "x", false), op("a", 20, 30, 422, reused, "r", false)}},
	} {
		res, err := checkHistory(c.history, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if got := len(res.illegal) == 0; got != c.ok || res.partitions != 1 || len(res.undecided) != 0 {
			t.Errorf("%s: linearizable %v, want %v (%+v)", c.name, got, c.ok, res)
		}
		if !c.ok && len(res.files) != 1 {
			t.Errorf("%s: visualisations %q, want one", c.name, res.files)
		}
	}
}
