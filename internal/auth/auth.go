// Package auth identifies the caller (the tenant) behind an API key.
package auth

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/dbsqlc"
	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/problem"
)

var queries = dbsqlc.New() // stateless: each query takes its connection or transaction

// Caller is an authenticated tenant.
type Caller struct {
	ID         string
	Name       string
	CreatedAt  time.Time
	WebhookURL string // where its events are pushed, "" for none (set by ListCallers only)
}

// HashKey is how an API key is stored and looked up: its SHA-256. A fast
// hash is enough for a long random secret (not a password), and the
// database finds it with a unique index.
func HashKey(apiKey string) []byte {
	h := sha256.Sum256([]byte(apiKey))
	return h[:]
}

// Authenticator maps API keys to callers. Known keys are cached briefly,
// sparing a database round trip per request, at the price of a revoked key
// working up to the TTL. Unknown keys are not (garbage would fill memory).
type Authenticator struct {
	pool *pgxpool.Pool
	ttl  time.Duration
	now  func() time.Time
	// published holds the demo callers' key hashes when they must not work
	// (outside the demo): refused before any lookup, even if left in the
	// database by an earlier demo.
	published map[[sha256.Size]byte]bool

	mu    sync.RWMutex
	cache map[[sha256.Size]byte]cached
}

type cached struct {
	caller  Caller
	expires time.Time
}

// NewAuthenticator returns an Authenticator caching known keys for ttl.
// Unless demoKeys, the demo callers' published keys are refused.
func NewAuthenticator(pool *pgxpool.Pool, ttl time.Duration, demoKeys bool) *Authenticator {
	a := &Authenticator{pool: pool, ttl: ttl, now: time.Now, cache: map[[sha256.Size]byte]cached{}}
	if !demoKeys {
		a.published = map[[sha256.Size]byte]bool{}
		for _, c := range DemoCallers {
			a.published[sha256.Sum256([]byte(c.APIKey))] = true
		}
	}
	return a
}

// Authenticate returns apiKey's caller, or an unauthorized problem.
func (a *Authenticator) Authenticate(ctx context.Context, apiKey string) (Caller, error) {
	if apiKey == "" {
		return Caller{}, problem.New(problem.Unauthorized, "send your API key as Authorization: Bearer <key>")
	}
	hash := sha256.Sum256([]byte(apiKey))
	if a.published[hash] {
		return Caller{}, problem.New(problem.Unauthorized,
			"this is a published demo API key; it works only on a demo server (DEMO_MODE=true or SEED_DEMO_CALLERS=true)")
	}
	now := a.now()
	a.mu.RLock()
	c, ok := a.cache[hash]
	a.mu.RUnlock()
	if ok && now.Before(c.expires) {
		return c.caller, nil
	}

	row, err := queries.GetCallerByAPIKeyHash(ctx, a.pool, hash[:])
	if err != nil {
		return Caller{}, postgres.NotFound(err, func() error { return problem.New(problem.Unauthorized, "the API key is not valid") })
	}
	caller := Caller{ID: row.ID, Name: row.Name}
	a.mu.Lock()
	a.cache[hash] = cached{caller: caller, expires: now.Add(a.ttl)}
	a.mu.Unlock()
	return caller, nil
}

// DemoCallers are the callers seeded for the demo and the tests. Their API
// keys are published (here and in the README), so they work only where they
// are seeded on purpose: in DEMO_MODE, or with SEED_DEMO_CALLERS=true.
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

// WebhookSecret is the caller's random secret, made with it, that signs
// the relay's deliveries of its events.
func WebhookSecret(ctx context.Context, db dbsqlc.DBTX, callerID string) (_ string, err error) {
	defer postgres.Wrap(&err, "auth.WebhookSecret(%s)", callerID)
	return queries.GetCallerWebhookSecret(ctx, db, callerID)
}

// ErrCallerExists is CreateCaller's answer for an id already taken.
var ErrCallerExists = errors.New("auth: a caller with this id exists")

// callerID is what a caller's id may look like: short and plain, as it names
// the caller in every tenant table, in logs and in downstream keys.
var callerID = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// CreateCaller creates the caller id, named name (or id), its events pushed
// to webhookURL (nil: kept for it to pull). It returns its fresh API key,
// shown this once (only its hash is stored), and its events' signing secret.
func CreateCaller(ctx context.Context, db dbsqlc.DBTX, id, name string, webhookURL *string) (apiKey, webhookSecret string, err error) {
	if !callerID.MatchString(id) {
		return "", "", fmt.Errorf("caller id %q: want 1 to 32 lower-case letters, digits or _, starting with a letter", id)
	}
	// 256 bits from the operating system's generator, in base32.
	apiKey = "sk_live_" + strings.ToLower(rand.Text()+rand.Text())
	webhookSecret, err = queries.CreateCaller(ctx, db, dbsqlc.CreateCallerParams{ID: id, Name: cmp.Or(name, id), ApiKeyHash: HashKey(apiKey), WebhookUrl: webhookURL})
	if postgres.IsNotFound(err) {
		return "", "", fmt.Errorf("%w: %s", ErrCallerExists, id)
	}
	return apiKey, webhookSecret, err
}

// ListCallers returns every caller, by id.
func ListCallers(ctx context.Context, db dbsqlc.DBTX) ([]Caller, error) {
	rows, err := queries.ListCallers(ctx, db)
	out := make([]Caller, len(rows))
	for i, r := range rows {
		out[i] = Caller{ID: r.ID, Name: r.Name, CreatedAt: r.CreatedAt, WebhookURL: postgres.Text(r.WebhookUrl)}
	}
	return out, err
}

type callerKey struct{}

// WithCaller returns ctx carrying the authenticated caller.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the authenticated caller ctx carries, if any: for code
// that runs outside the authentication middleware too (the request log).
func CallerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// CallerFrom returns the caller carried by ctx. Handlers behind the auth
// middleware can rely on it; a missing caller is a wiring bug.
func CallerFrom(ctx context.Context) Caller {
	c, ok := CallerOf(ctx)
	if !ok {
		panic("auth: no caller in context: is the handler behind the authentication middleware?")
	}
	return c
}
