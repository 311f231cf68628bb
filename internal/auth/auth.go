// Package auth identifies the caller (the tenant) behind an API key.
package auth

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: every query takes its connection or transaction as an argument

// Caller is an authenticated tenant.
type Caller struct {
	ID   string
	Name string
}

// HashKey is how an API key is stored and looked up: SHA-256 of the key.
// API keys are long random secrets, not passwords, so a fast hash is enough
// and lets the database find the key by its hash with a unique index.
func HashKey(apiKey string) []byte {
	h := sha256.Sum256([]byte(apiKey))
	return h[:]
}

// Authenticator maps API keys to callers. Known keys are cached in memory
// for a short time so that authentication does not cost a database round
// trip on every request; the price is that a revoked key keeps working for
// up to the cache TTL. Unknown keys are not cached (that path is not hot,
// and caching it would let garbage keys fill memory).
type Authenticator struct {
	pool *pgxpool.Pool
	ttl  time.Duration
	now  func() time.Time

	mu    sync.RWMutex
	cache map[[sha256.Size]byte]cached
}

type cached struct {
	caller  Caller
	expires time.Time
}

// NewAuthenticator returns an Authenticator caching known keys for ttl.
func NewAuthenticator(pool *pgxpool.Pool, ttl time.Duration) *Authenticator {
	return &Authenticator{
		pool: pool, ttl: ttl, now: time.Now,
		cache: map[[sha256.Size]byte]cached{},
	}
}

// Authenticate returns the caller whose API key is apiKey, or an
// unauthorized problem.
func (a *Authenticator) Authenticate(ctx context.Context, apiKey string) (Caller, error) {
	if apiKey == "" {
		return Caller{}, problem.New(problem.Unauthorized, "send your API key as Authorization: Bearer <key>")
	}
	hash := sha256.Sum256([]byte(apiKey))
	now := a.now()
	a.mu.RLock()
	c, ok := a.cache[hash]
	a.mu.RUnlock()
	if ok && now.Before(c.expires) {
		return c.caller, nil
	}

	row, err := queries.GetCallerByAPIKeyHash(ctx, a.pool, hash[:])
	if postgres.IsNotFound(err) {
		return Caller{}, problem.New(problem.Unauthorized, "the API key is not valid")
	}
	if err != nil {
		return Caller{}, err
	}
	caller := Caller{ID: row.ID, Name: row.Name}
	a.mu.Lock()
	a.cache[hash] = cached{caller: caller, expires: now.Add(a.ttl)}
	a.mu.Unlock()
	return caller, nil
}

// DemoCallers are the callers seeded for the demo and the tests, with their
// API keys. They are test keys for a local service; never seed them in
// production (SEED_DEMO_CALLERS=false).
var DemoCallers = []struct{ ID, Name, APIKey string }{
	{"acme", "Acme Corp", "sk_test_acme"},
	{"globex", "Globex Corporation", "sk_test_globex"},
}

// SeedDemoCallers creates (or refreshes) the demo callers.
func SeedDemoCallers(ctx context.Context, db dbsqlc.DBTX) error {
	for _, c := range DemoCallers {
		if err := queries.UpsertCaller(ctx, db, dbsqlc.UpsertCallerParams{ID: c.ID, Name: c.Name, ApiKeyHash: HashKey(c.APIKey)}); err != nil {
			return err
		}
	}
	return nil
}

type callerKey struct{}

// WithCaller returns ctx carrying the authenticated caller.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller carried by ctx. Handlers behind the auth
// middleware can rely on it; a missing caller is a wiring bug.
// CallerOf returns the authenticated caller ctx carries, if any: for code
// that runs outside the authentication middleware too (the request log).
func CallerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

func CallerFrom(ctx context.Context) Caller {
	c, ok := ctx.Value(callerKey{}).(Caller)
	if !ok {
		panic("auth: no caller in context: is the handler behind the authentication middleware?")
	}
	return c
}
