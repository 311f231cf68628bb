package idempotency

import (
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

// cachedReplay is one completed record's answer, laid out for the garbage
// collector as much as for the replay. The cache holds thousands of entries
// for up to maxReplayAge, and every collection walks all of them: each
// object an entry keeps is one more to mark, and each pointer in it one
// more to follow, on every cycle, paid for by the requests that allocate
// meanwhile. So the bytes are kept in one slice with no pointers in it,
// which the collector marks without scanning, and the headers in one slice
// of strings instead of a map of slices: fewer objects and fewer bytes
// than the request's slices and a clone of the answer's header map
// (docs/performance.md has the counts).
type cachedReplay struct {
	// data is, end to end: the first request's fingerprint, method and
	// path (the method and path for a 422), then the answer's body.
	data                      []byte
	fpEnd, methodEnd, pathEnd int
	status                    int
	// header is the answer's headers as name, value pairs: a name with
	// two values is there twice. noValue names the headers present with
	// no value (nil for almost every entry): net/http writes nothing for
	// them, but their presence still stops it adding its own (a sniffed
	// Content-Type, a Date), so a replay keeps them too.
	header      []string
	noValue     []string
	expires     time.Time // on the monotonic clock
	expiresWall time.Time // the same instant on the wall clock
}

func newCachedReplay(req Request, resp *Response, expires time.Time) *cachedReplay {
	e := &cachedReplay{status: resp.Status, expires: expires, expiresWall: expires.Round(0)}
	e.data = make([]byte, 0, len(req.Fingerprint)+len(req.Method)+len(req.Path)+len(resp.Body))
	e.data = append(e.data, req.Fingerprint...)
	e.fpEnd = len(e.data)
	e.data = append(e.data, req.Method...)
	e.methodEnd = len(e.data)
	e.data = append(e.data, req.Path...)
	e.pathEnd = len(e.data)
	e.data = append(e.data, resp.Body...)
	n := 0
	for _, values := range resp.Header {
		n += 2 * len(values)
	}
	e.header = make([]string, 0, n)
	for name, values := range resp.Header {
		if len(values) == 0 {
			e.noValue = append(e.noValue, name)
		}
		for _, v := range values {
			e.header = append(e.header, name, v)
		}
	}
	return e
}

func (e *cachedReplay) fingerprint() []byte { return e.data[:e.fpEnd:e.fpEnd] }

func (e *cachedReplay) method() string { return string(e.data[e.fpEnd:e.methodEnd]) }

func (e *cachedReplay) path() string { return string(e.data[e.methodEnd:e.pathEnd]) }

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
// header with one value gets the entry's slice of it, capped at its
// length, so that a writer appending to a header of one replay cannot
// reach into another's; one with several values gets a new slice. The
// body is the entry's, shared by every replay of it and only ever read.
// The map is made for each replay rather than kept with the entry: most
// entries are never replayed, and every one is marked on every collection.
func (e *cachedReplay) response() *Response {
	h := make(http.Header, len(e.header)/2+len(e.noValue)) // room for every name, if each has one value
	for i := 0; i < len(e.header); i += 2 {
		name := e.header[i]
		if values, ok := h[name]; ok {
			h[name] = append(values, e.header[i+1])
			continue
		}
		h[name] = e.header[i+1 : i+2 : i+2]
	}
	for _, name := range e.noValue {
		h[name] = nil
	}
	return &Response{Status: e.status, Header: h, Body: e.data[e.pathEnd:], Replayed: true}
}
