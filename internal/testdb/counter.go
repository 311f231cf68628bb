package testdb

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx tracer that counts what a pool sends: the statements,
// and the round trips they took (a statement sent alone is one, a batch is
// one). Set it as the pool's ConnConfig.Tracer (Pool's options). It sees
// what pgx traces: not the round trip in which pgx prepares a batch's
// statements the first time a connection meets them.
type Counter struct{ statements, trips atomic.Int64 }

// Counts is what a Counter has counted.
type Counts struct{ Statements, RoundTrips int64 }

// Load returns the counts so far.
func (c *Counter) Load() Counts { return Counts{c.statements.Load(), c.trips.Load()} }

// Reset sets the counts to zero.
func (c *Counter) Reset() { c.statements.Store(0); c.trips.Store(0) }

func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	c.trips.Add(1)
	return ctx
}

func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	return ctx
}

func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
