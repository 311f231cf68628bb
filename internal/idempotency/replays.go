package idempotency

import (
	"bytes"
	"net/http"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// The replay cache keeps completed records' answers in this process, so
// that a replay needs no database round trip. Only a completed record may
// be cached: it never changes until the sweeper deletes it.
//
// An answer must not outlive that deletion: the next request with the key
// starts a new operation, and a replica still replaying the old answer
// would give two answers for one key. The sweeper deletes a record once
// created_at is the retention window behind the database's now(); the
// claim reports the record's age on that clock, and the entry lives at most
// nine tenths of what is left of the window, less a minute, measured on
// this process's clocks from before the claim was sent. No two machines'
// readings are compared, so skew cannot stretch an entry's life; the tenth
// and the minute cover their rates differing and the database's clock
// jumping. The sweeper must use the server's retention (restart the
// servers with a shorter one before the sweeper runs with it).
type replayCache struct {
	entries   *lru.Cache[replayKey, *cachedReplay]
	retention time.Duration
	now       func() time.Time // time.Now; a test moves it on
}

// maxReplayAge caps any entry's life: retries come within minutes.
const maxReplayAge = time.Hour

// replayMargin is the minute, for the database's clock to jump ahead (a
// failover to a primary whose clock runs ahead), bringing every sweep closer.
const replayMargin = time.Minute

// replayKey is a caller's key: two callers' equal keys never share answers.
type replayKey struct{ callerID, key string }

// cachedReplay is one completed record's answer, and what a 422 names of
// its request, in copies of its own: callers may reuse their buffers.
type cachedReplay struct {
	fingerprint  []byte
	method, path string
	status       int
	header       http.Header
	body         []byte
	expires      time.Time // on the monotonic clock
	expiresWall  time.Time // the same instant on the wall clock
}

func newCachedReplay(req Request, resp *Response, expires time.Time) *cachedReplay {
	return &cachedReplay{
		fingerprint: bytes.Clone(req.Fingerprint), method: req.Method, path: req.Path,
		status: resp.Status, header: resp.Header.Clone(), body: bytes.Clone(resp.Body),
		expires: expires, expiresWall: expires.Round(0),
	}
}

// CacheReplays keeps the answers of up to size completed records in
// memory; retention (IDEMPOTENCY_KEY_RETENTION) bounds how long one may be
// kept. Call it before the Store is used. A size below 1 caches nothing.
func (s *Store) CacheReplays(size int, retention time.Duration) {
	if entries, err := lru.New[replayKey, *cachedReplay](size); err == nil {
		s.replays = &replayCache{entries: entries, retention: retention, now: time.Now}
	}
}

// get returns the caller's cached answer for key, if live (a nil cache has none).
func (c *replayCache) get(callerID, key string) (*cachedReplay, bool) {
	if c == nil {
		return nil, false
	}
	k := replayKey{callerID, key}
	e, ok := c.entries.Get(k)
	if now := c.now(); ok && (!now.Before(e.expires) || !now.Before(e.expiresWall)) {
		c.entries.Remove(k)
		return nil, false
	}
	return e, ok
}

// clock is when a claim is sent, for put; zero for a nil cache.
func (c *replayCache) clock() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.now()
}

// put remembers resp as the completed answer to req. sent is when the
// claim that read or created the record was sent (this process's clock),
// age the record's age then (the database's). A nil cache keeps nothing.
func (c *replayCache) put(req Request, resp *Response, sent time.Time, age time.Duration) {
	if c == nil {
		return
	}
	life := min(maxReplayAge, (c.retention-age)/10*9-replayMargin)
	// Kept on the monotonic clock, which wall-clock steps cannot move, and
	// on the wall clock, which counts on while the process is frozen (a
	// paused VM, SIGSTOP): the first of the two ends the entry.
	expires := sent.Add(life)
	if !c.now().Before(expires) { // already over (as is any with life <= 0: sent is past)
		return
	}
	c.entries.Add(replayKey{req.CallerID, req.Key}, newCachedReplay(req, resp, expires))
}

// response is the entry as a replay, with a header map of its own, so a
// writer cannot change another replay's headers. The body is only read.
func (e *cachedReplay) response() *Response {
	return &Response{Status: e.status, Header: e.header.Clone(), Body: e.body, Replayed: true}
}
