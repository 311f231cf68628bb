// Package idempotency makes a state-changing request safe to retry. It
// follows Brandur Leach's "Implementing Stripe-like idempotency keys in
// Postgres" and the IETF Idempotency-Key draft; docs/from-the-article.md
// maps the article's words to this code and says where it departs.
//
// A local operation (an order create) is one transaction: its effect and
// its key's record, inserted completed with the answer.
//
// An operation with an outside effect (a charge) inserts its key's record
// in the transaction of its first phase, then runs as a chain of phases:
// each one transaction that does its work and records the next recovery
// point, or the final response. A request that finds the key taken gets
// what the record says (found, in claim.go): a 422 for another request, a
// replay of a completed one, a wait while a live lease holds it, a takeover
// (resuming from the recovery point) once the lease lapsed, or the
// dead-letter answer.
//
// An owner's phases name its attempt (fencing): one that stalled past its
// lease and was taken over has its next phase refused (SQLSTATE RS001), so
// it cannot overwrite the new owner's result. Phases run detached from the
// client's cancellation, bounded by StoreConfig.MaxRun, and leases run on
// the database's clock alone. docs/design.md is the full account.
//
// Read it in this order: operation.go, store.go, local.go, claim.go, run.go,
// lease.go, wait.go, replays.go, reconciler.go.
package idempotency
