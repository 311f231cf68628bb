package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retrysafe/payments/internal/auth"
	"github.com/retrysafe/payments/internal/cardprocessor"
	"github.com/retrysafe/payments/internal/charges"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/idempotency"
	"github.com/retrysafe/payments/internal/postgres"
)

// caller is a caller the charges and payouts run as, with its orders to charge.
type caller struct {
	id, apiKey string
	orders     []string
	next       atomic.Int64
}

// benchCallers creates n callers, bench_00 and on.
func benchCallers(ctx context.Context, admin *pgxpool.Pool, n int) ([]*caller, error) {
	out := make([]*caller, n)
	for i := range out {
		id := fmt.Sprintf("bench_%02d", i)
		key, _, err := auth.CreateCaller(ctx, admin, id, id, nil)
		if err != nil {
			return nil, err
		}
		out[i] = &caller{id: id, apiKey: key}
	}
	return out, nil
}

// addOrders gives the callers n pending orders to charge, the k-th to
// callers[k % len(callers)], written in that order. Requests take the
// callers in turn, so the orders charged at once lie side by side in the
// table whether one caller has them or sixteen, as orders created side by
// side in time do: the two phases differ in their callers alone.
func addOrders(ctx context.Context, admin *pgxpool.Pool, callers []*caller, n int) error {
	ids, owners := make([]string, n), make([]string, n)
	for k := range ids {
		c := callers[k%len(callers)]
		ids[k], owners[k] = postgres.NewID("ord"), c.id
		c.orders = append(c.orders, ids[k])
	}
	_, err := admin.Exec(ctx, `INSERT INTO orders (caller_id, id, amount, currency) SELECT unnest($1::text[]), unnest($2::text[]), 1999, 'usd'`, owners, ids)
	return err
}

// nextOrder is an order of c's that nothing has charged yet.
func (c *caller) nextOrder() (string, error) {
	i := c.next.Add(1) - 1
	if i >= int64(len(c.orders)) {
		return "", errors.New("ran out of orders to charge: raise the count")
	}
	return c.orders[i], nil
}

// startQuietProcessor serves the fake processor with no webhooks on a
// loopback port, and returns its URL and the secret a server must be
// given for it (unused: it sends nothing).
func startQuietProcessor() (url, secret string, err error) {
	secret = "whsec_" + rand.Text()
	p, err := fakeprocessor.New(fakeprocessor.Config{})
	if err != nil {
		return "", "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) // for the whole run: connect's stopServers leaves it
	return "http://" + ln.Addr().String(), secret, nil
}

// answersAtOnce is a processor that charges every card at once, with no
// network and no database: the charge's floor measures our statements alone.
type answersAtOnce struct{ cardprocessor.Processor }

func (answersAtOnce) Charge(context.Context, string, cardprocessor.ChargeRequest) (cardprocessor.ChargeResult, error) {
	return cardprocessor.ChargeResult{ID: "pch_floor"}, nil
}

// onPool returns build's value for the pool pool() returns, made again
// when connect() has opened another pool.
func onPool[T any](pool func() *pgxpool.Pool, build func(*pgxpool.Pool) T) func() T {
	var (
		mu      sync.Mutex
		value   T
		current *pgxpool.Pool
	)
	return func() T {
		mu.Lock()
		defer mu.Unlock()
		if p := pool(); p != current {
			current, value = p, build(p)
		}
		return value
	}
}

// engineOn returns the service's idempotency engine over the pool pool()
// returns.
func engineOn(pool func() *pgxpool.Pool) func() *idempotency.Store {
	return onPool(pool, func(p *pgxpool.Pool) *idempotency.Store {
		return idempotency.NewStore(p, idempotency.StoreConfig{Lease: 30 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	})
}

// chargeFloor is the floor of a charge: the service's own charge operation
// (the claim and first phase, the load, the final phase), run in this
// process through pgx on the pool pool() returns, with a processor that
// answers at once and no HTTP.
func chargeFloor(ctx context.Context, name string, pool func() *pgxpool.Pool, callers []*caller) (phase, error) {
	body := []byte(`{"payment_method":"pm_card_visa"}`)
	engine := engineOn(pool)
	op := onPool(pool, func(p *pgxpool.Pool) idempotency.Operation {
		return charges.NewService(p, answersAtOnce{}).ChargeOperation()
	})
	return phase{name, func(i int64) error {
		c := callers[i%int64(len(callers))]
		order, err := c.nextOrder()
		if err != nil {
			return err
		}
		path := "/v1/orders/" + order + "/charges"
		doc, _ := idempotency.DecodeJSON(body)
		fp, err := idempotency.Fingerprint("POST", path, doc)
		if err != nil {
			return err
		}
		resp, err := engine().Serve(ctx, op(), idempotency.Request{CallerID: c.id, Key: "floor-" + order, Operation: charges.OperationCharge,
			Method: "POST", Path: path, Fingerprint: fp}, map[string]string{"order_id": order}, body)
		if err == nil && resp.Status != http.StatusCreated {
			err = fmt.Errorf("floor charge: %d %s", resp.Status, resp.Body)
		}
		return err
	}}, nil
}
