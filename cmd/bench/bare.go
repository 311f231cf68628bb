package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/apigen"
	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
)

// The bare hop is what the service is compared with over HTTP: the
// smallest server that does a keyed create's database work, so that
// service / bare hop is what the service's own code costs, and bare hop /
// floor what the hop itself (a second process, net/http, two more loopback
// transfers per request) costs.
//
// It is this same binary, started again by the run as a child process
// (bench -bare-serve ADDR), so that its CPU is read from /proc apart from
// the load generator's, exactly as the real server's is. It lives here, in
// cmd/bench, and nothing else imports it: no production binary can serve it.
//
// For POST /v1/orders with an Idempotency-Key it runs literally the
// service's statements (the generated internal/dbsqlc queries, on a
// pgxpool opened from the same DATABASE_URL, so with the same pool size):
// the key's lookup; then, in one transaction (postgres.TransactPipelined,
// as the service's: BEGIN with the insert, COMMIT with the record's, three
// round trips in all), the order insert and the completed record's insert,
// storing the order's JSON (apigen.Order, the service's own body) and its
// headers. A lookup that finds a completed record answers with its stored
// body. With -bare-cache N it keeps the last N answers in an LRU, as the
// service's replay cache does, and answers a replay from it without the
// lookup.
//
// What it leaves out is everything else the service does: authentication
// (the caller is always acme; the service's is cached, no statement), the
// contract's validation, the I-JSON duplicate-member check, the canonical
// JSON fingerprint (here a SHA-256 of the raw body, enough to tell a
// different body), metrics, the log line, Echo and the strict server's
// binding, the detached context with its lease timeout, and the stored
// headers' decoding on a replay. The body is decoded with encoding/json,
// which any server must do.

// bareServe runs the bare hop on addr until the process is killed. With
// spin > 0, every request first keeps a CPU busy that long (-bare-spin).
func bareServe(addr string, cacheSize int, spin time.Duration) error {
	ctx := context.Background()
	pool, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), false)
	if err != nil {
		return err
	}
	defer pool.Close()
	b := &bare{pool: pool, spin: spin}
	if cacheSize > 0 {
		if b.cache, err = lru.New[bareKey, *bareAnswer](cacheSize); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders", b.createOrder)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := pool.Ping(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

type bare struct {
	pool  *pgxpool.Pool
	cache *lru.Cache[bareKey, *bareAnswer] // nil: every replay is a claim
	spin  time.Duration
}

// burn keeps this goroutine's CPU busy for b.spin: with -bare-spin set
// to the service's extra CPU per request, the bare hop is as slow as the
// service without doing its work, and what PostgreSQL spends per request
// behind it shows how much of PostgreSQL's extra behind the service comes
// from the server's pace alone rather than from anything the service
// sends (docs/performance.md: three runs consistent with that, no proof).
func (b *bare) burn() {
	for end := time.Now().Add(b.spin); time.Now().Before(end); {
	}
}

type bareKey struct{ callerID, key string }

// bareAnswer is a completed record's answer, as cached.
type bareAnswer struct {
	fingerprint []byte
	status      int
	body        []byte
}

const bareCaller = "acme"

func (b *bare) createOrder(w http.ResponseWriter, r *http.Request) {
	if b.spin > 0 {
		b.burn()
	}
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if err != nil || key == "" {
		http.Error(w, "a body and an Idempotency-Key, please", http.StatusBadRequest)
		return
	}
	fp := sha256.Sum256(body)
	if b.cache != nil {
		if a, ok := b.cache.Get(bareKey{bareCaller, key}); ok {
			b.replay(w, a, fp[:])
			return
		}
	}
	var in struct {
		Amount      int64   `json:"amount"`
		Currency    string  `json:"currency"`
		Description *string `json:"description"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}

	row, err := queries.FindIdempotencyKey(ctx, b.pool, dbsqlc.FindIdempotencyKeyParams{CallerID: bareCaller, Key: key})
	switch {
	case err == nil:
		k := row.IdempotencyKey
		if k.Status != "completed" || k.ResponseStatus == nil {
			http.Error(w, "in progress", http.StatusConflict)
			return
		}
		a := &bareAnswer{fingerprint: k.RequestFingerprint, status: int(*k.ResponseStatus), body: k.ResponseBody}
		if b.cache != nil && bytes.Equal(a.fingerprint, fp[:]) {
			b.cache.Add(bareKey{bareCaller, key}, a)
		}
		b.replay(w, a, fp[:])
		return
	case !postgres.IsNotFound(err):
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}

	var resp []byte
	var location string
	err = postgres.TransactPipelined(ctx, b.pool, func(tx *postgres.PipelinedTx) error {
		o, err := queries.CreateOrder(ctx, tx, dbsqlc.CreateOrderParams{
			CallerID: bareCaller, ID: postgres.NewID(postgres.PrefixOrder), Amount: in.Amount, Currency: in.Currency, Description: in.Description,
		})
		if err != nil {
			return err
		}
		if resp, err = json.Marshal(apigen.Order{
			Id: o.ID, Amount: o.Amount, Currency: apigen.Currency(o.Currency), Description: o.Description,
			Status: apigen.OrderStatus(o.Status), CreatedAt: o.CreatedAt,
		}); err != nil {
			return err
		}
		location = "/v1/orders/" + o.ID
		status := int32(http.StatusCreated)
		return queries.InsertCompletedIdempotencyKey(ctx, tx.ThenCommit(), dbsqlc.InsertCompletedIdempotencyKeyParams{
			CallerID: bareCaller, Key: key, Operation: "createOrder", RequestMethod: r.Method, RequestPath: r.URL.Path,
			RequestFingerprint: fp[:], ResponseStatus: &status,
			ResponseHeaders: []byte(`{"Content-Type":["application/json"],"Location":["` + location + `"]}`),
			ResponseBody:    resp,
		})
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if b.cache != nil {
		b.cache.Add(bareKey{bareCaller, key}, &bareAnswer{fingerprint: fp[:], status: http.StatusCreated, body: resp})
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Location"] = []string{location}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(resp)
}

// replay answers with a completed record's stored body, or 422 for a
// different body under the same key.
func (b *bare) replay(w http.ResponseWriter, a *bareAnswer, fp []byte) {
	if !bytes.Equal(a.fingerprint, fp) {
		http.Error(w, "key reused for another body", http.StatusUnprocessableEntity)
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Idempotent-Replayed"] = []string{"true"}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}
