package idempotency

import (
	"bytes"
	"net/http"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// The replay cache keeps, in this process, the answers of completed
// records, so that a replay is served without a round trip to the
// database. A replay is the one answer that may be cached, because a
// completed record never changes: its fingerprint and its stored response
// are written once, in the transaction that completes it, and after that
// the record is only ever read, until the sweeper deletes it.
//
// That deletion is the one thing a cached answer must not outlive. Once the
// sweeper has removed a record, the key is free: the next request with it
// starts a new operation, on whichever replica it reaches, and a replica
// still replaying the old answer would give two answers for one key. So an
// entry expires before its record can be swept. The sweeper deletes a
// record once created_at is more than the retention window behind the
// database's now(); the claim reports the record's age on that same clock,
// and the entry lives at most nine tenths of what is left of the window,
// less a minute, measured on this process's clocks from before the claim
// was sent. Nothing compares the two machines' clock readings, so skew
// between them cannot stretch an entry's life; the tenth and the minute
// held back cover their rates differing and the database's clock jumping.
// This relies on the sweeper using the same retention as the server, which
// the contract needs anyway: it is the expires_at the server shows for
// every record. (To shorten the retention, restart the servers with the
// new value before the sweeper runs with it.)
//
// Only completed records are cached. A record in progress, or set aside
// (dead), changes; its requests always go to the database. The cache is
// bounded (least recently used entries go first) and every entry is also
// capped at maxReplayAge, so a record's answer leaves memory soon after
// its retries stop.
type replayCache struct {
	entries   *lru.Cache[replayKey, *cachedReplay]
	retention time.Duration
	now       func() time.Time // time.Now; a test moves it on
}

// maxReplayAge caps how long any entry is kept. Retries come within
// minutes of the first request; keeping an answer longer only uses memory.
const maxReplayAge = time.Hour

// replayMargin is held back from every entry's life on top of the tenth:
// room for the database's clock to jump ahead (a failover to a primary
// whose clock runs ahead), which brings the sweep of every record closer.
const replayMargin = time.Minute

// replayKey is a caller's key: two callers' equal keys are different
// records, and neither ever sees the other's answer.
type replayKey struct{ callerID, key string }

// cachedReplay is one completed record's answer, with what a 422 names of
// the first request. It holds its own copies: the caller's buffers may be
// reused once put returns.
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

func newReplayCache(size int, retention time.Duration) *replayCache {
	entries, err := lru.New[replayKey, *cachedReplay](size)
	if err != nil { // only for a size below 1, which CacheReplays rules out
		panic(err)
	}
	return &replayCache{entries: entries, retention: retention, now: time.Now}
}

// get returns the cached answer for the caller's key, if one is live. A
// nil cache (CacheReplays was not called) has nothing.
func (c *replayCache) get(callerID, key string) (*cachedReplay, bool) {
	if c == nil {
		return nil, false
	}
	k := replayKey{callerID, key}
	e, ok := c.entries.Get(k)
	if !ok {
		return nil, false
	}
	if now := c.now(); !now.Before(e.expires) || !now.Before(e.expiresWall) {
		c.entries.Remove(k)
		return nil, false
	}
	return e, true
}

// clock reads the cache's clock: when a claim is sent, for put. A nil
// cache needs no time.
func (c *replayCache) clock() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.now()
}

// put remembers resp as the completed answer to req. sent is when (on
// this process's clock) the claim that read or created the record was
// sent, and age how old the record was then on the database's clock. A
// nil cache keeps nothing.
func (c *replayCache) put(req Request, resp *Response, sent time.Time, age time.Duration) {
	if c == nil {
		return
	}
	life := min(maxReplayAge, (c.retention-age)/10*9-replayMargin)
	if life <= 0 {
		return
	}
	// The deadline is kept twice: on the monotonic clock, which wall-clock
	// steps cannot move, and on the wall clock, which goes on counting
	// while the process is frozen (a paused VM, SIGSTOP) when the
	// monotonic clock may not. The entry dies at the first of the two.
	expires := sent.Add(life)
	if now := c.now(); !now.Before(expires) {
		return
	}
	c.entries.Add(replayKey{req.CallerID, req.Key}, newCachedReplay(req, resp, expires))
}

// response is the entry as a replay, with a header map of its own: a
// writer that changes one replay's headers cannot change another's. The
// body is shared, and only ever read.
func (e *cachedReplay) response() *Response {
	return &Response{Status: e.status, Header: e.header.Clone(), Body: e.body, Replayed: true}
}
