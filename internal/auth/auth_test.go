package auth

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/problem"
	"github.com/retrysafe/payments/internal/testdb"
)

func TestAuthenticateCachesKnownKeys(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	ctx := context.Background()
	if err := SeedDemoCallers(ctx, pool); err != nil {
		t.Fatal(err)
	}
	a := NewAuthenticator(pool, time.Minute, true)
	now := time.Now()
	a.now = func() time.Time { return now }

	c, err := a.Authenticate(ctx, "sk_test_acme")
	if err != nil || c.ID != "acme" {
		t.Fatalf("Authenticate(sk_test_acme) = %+v, %v", c, err)
	}
	// The key is only ever stored hashed.
	var stored []byte
	if err := pool.QueryRow(ctx, `SELECT api_key_hash FROM callers WHERE id = 'acme'`).Scan(&stored); err != nil || string(stored) == "sk_test_acme" || len(stored) != 32 {
		t.Fatalf("stored key: %q, %v; want a SHA-256 hash", stored, err)
	}

	// Within the TTL the cache answers without the database: even a key
	// revoked in the database still works (the documented price of the cache).
	if _, err := pool.Exec(ctx, `UPDATE callers SET api_key_hash = $1 WHERE id = 'acme'`, HashKey("sk_test_rotated")); err != nil {
		t.Fatal(err)
	}
	if c, err := a.Authenticate(ctx, "sk_test_acme"); err != nil || c.ID != "acme" {
		t.Fatalf("cached key within TTL: %+v, %v", c, err)
	}
	// After the TTL the database is asked again, and the revoked key fails.
	now = now.Add(time.Minute + time.Second)
	_, err = a.Authenticate(ctx, "sk_test_acme")
	var p *problem.Error
	if !errors.As(err, &p) || p.Code != problem.Unauthorized {
		t.Fatalf("revoked key after TTL: %v; want unauthorized", err)
	}
	if c, err := a.Authenticate(ctx, "sk_test_rotated"); err != nil || c.ID != "acme" {
		t.Fatalf("rotated key: %+v, %v", c, err)
	}
	for _, bad := range []string{"", "sk_test_nobody"} {
		if _, err := a.Authenticate(ctx, bad); !errors.As(err, &p) || p.Code != problem.Unauthorized {
			t.Errorf("Authenticate(%q) = %v; want unauthorized", bad, err)
		}
	}
}
