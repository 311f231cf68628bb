package idempotency

// Declaring an operation. The domain package that owns it declares it,
// Local or External if keyed, Safe if a read; internal/app registers it
// (NewRegistry); an adapter in internal/server serves it, and the
// reconciler resumes it, from that declaration. No other code names it.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/payments/internal/dbsqlc"
)

// Input is a request as its declared operation sees it (a read: no key, no body).
type Input[B any] struct {
	Request                   // who asked, under which key
	Path    map[string]string // the path's parameters, by the contract's names
	Body    B                 // the body, validated against the contract, decoded
}

// Operation is a declared operation: what Local, External and Safe return.
type Operation struct {
	Name  string // the contract's operationId, stored with every record
	Safe  bool   // declared by Safe: served without a key
	serve func(ctx context.Context, s *Store, req Request, path map[string]string, body []byte) (*Response, error)
	// Resume drives an external operation on from its recovery point, for the reconciler; nil if local.
	Resume  Step
	invalid string // why the declaration cannot work, for NewRegistry
}

// Local declares a local operation: run writes its effect in tx and returns
// the answer to store, both committed with the record (LocalFunc says more).
func Local[B any](name string, run func(ctx context.Context, tx pgx.Tx, in Input[B]) (*Response, error)) Operation {
	return Operation{Name: name, serve: func(ctx context.Context, s *Store, req Request, path map[string]string, body []byte) (*Response, error) {
		in, err := decode[B](req, path, body)
		if err != nil {
			return nil, err
		}
		return s.serveLocal(ctx, req, func(ctx context.Context, tx pgx.Tx) (*Response, error) { return run(ctx, tx, in) })
	}}
}

// Safe declares a read (the contract's class safe) that a resource's
// package serves from its declaration, as a keyed one, with no handler in
// internal/server: run reads with db and returns the answer. No key, no
// record: nothing is stored.
func Safe(name string, run func(ctx context.Context, db dbsqlc.DBTX, in Input[struct{}]) (*Response, error)) Operation {
	return Operation{Name: name, Safe: true, serve: func(ctx context.Context, s *Store, req Request, path map[string]string, _ []byte) (*Response, error) {
		return run(ctx, s.pool, Input[struct{}]{Request: req, Path: path})
	}}
}

// External declares an operation with an outside effect (a processor
// call) as its recovery points, each with the step that moves it on, run
// alike by a client's request, its retry and the reconciler.
type External[B any] struct {
	Name string
	// Start is the first phase, in the claim's transaction: it writes all
	// the later steps need (they have the record and its rows, not the
	// body) and returns the recovery point reached, or a final answer. Its
	// 404 is not stored: the key stays free for a fixed request.
	Start func(ctx context.Context, tx pgx.Tx, rec Record, in Input[B]) (Result, error)
	// Steps moves the operation on from each later recovery point by one
	// or more l.Phase, the last storing the final answer.
	Steps map[RecoveryPoint]Step
}

// Operation is the declaration, for NewRegistry.
func (e External[B]) Operation() Operation {
	var invalid string
	if e.Start == nil || len(e.Steps) == 0 {
		invalid = "an external operation needs a Start and at least one step after it"
	}
	return Operation{
		Name:    e.Name,
		invalid: invalid,
		Resume:  e.loop(nil),
		serve: func(ctx context.Context, s *Store, req Request, path map[string]string, body []byte) (*Response, error) {
			in, err := decode[B](req, path, body)
			if err != nil {
				return nil, err
			}
			start := func(ctx context.Context, tx pgx.Tx, rec Record) (Result, error) { return e.Start(ctx, tx, rec, in) }
			return s.serveExternal(ctx, req, start, e.loop(&in))
		},
	}
}

// loop runs the step for the record's recovery point until a phase
// stores the final answer. The reconciler has no input (in is nil): it
// never starts an operation, it deletes those not started.
func (e External[B]) loop(in *Input[B]) Step {
	return func(ctx context.Context, l *Lease) error {
		for l.response == nil {
			var err error
			switch point := l.RecoveryPoint(); {
			case point == RecoveryStarted && in != nil:
				err = l.Phase(ctx, func(ctx context.Context, tx pgx.Tx) (Result, error) { return e.Start(ctx, tx, l.Record(), *in) })
			case e.Steps[point] != nil:
				err = e.Steps[point](ctx, l)
			default:
				return fmt.Errorf("%s: no step from recovery point %q", e.Name, point)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// decode reads a request's body into the operation's type. The contract
// middleware validated it against a schema that allows no unnamed member,
// so the only failure left is a value the type cannot hold (1999.0 for an
// integer): a *json.UnmarshalTypeError, a 400 before anything is stored.
func decode[B any](req Request, path map[string]string, body []byte) (Input[B], error) {
	in := Input[B]{Request: req, Path: path}
	if len(body) == 0 {
		return in, nil
	}
	return in, json.Unmarshal(body, &in.Body)
}

// Serve runs req as its declared operation op.
func (s *Store) Serve(ctx context.Context, op Operation, req Request, path map[string]string, body []byte) (*Response, error) {
	return op.serve(ctx, s, req, path, body)
}

// Registry is every declared operation, by name.
type Registry struct{ ops map[string]Operation }

// NewRegistry registers ops, refusing at start-up rather than at the first
// crash two of one name, or an external one that nothing would finish.
func NewRegistry(ops ...Operation) (*Registry, error) {
	r := &Registry{ops: make(map[string]Operation, len(ops))}
	for _, op := range ops {
		switch _, dup := r.ops[op.Name]; {
		case dup:
			return nil, fmt.Errorf("operation %q is declared twice", op.Name)
		case op.serve == nil:
			return nil, fmt.Errorf("operation %q is not declared through Local, External or Safe", op.Name)
		case op.invalid != "":
			return nil, fmt.Errorf("operation %q: %s", op.Name, op.invalid)
		}
		r.ops[op.Name] = op
	}
	return r, nil
}

// Lookup returns the operation declared under name.
func (r *Registry) Lookup(name string) (Operation, bool) {
	op, ok := r.ops[name]
	return op, ok
}

// resumable lists the external operations, the ones the reconciler claims.
func (r *Registry) resumable() []string {
	names := slices.Sorted(maps.Keys(r.ops))
	return slices.DeleteFunc(names, func(name string) bool { return r.ops[name].Resume == nil })
}
