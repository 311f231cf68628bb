// Package idempotency makes a state-changing request safe to retry.
//
// It follows Brandur Leach's "Implementing Stripe-like idempotency keys in
// Postgres" and the IETF Idempotency-Key draft. docs/from-the-article.md
// maps the article's words to this code (locked_at is the lease, the
// completer the reconciler, the reaper the sweeper) and says where it
// departs from it, and why: READ COMMITTED with fencing instead of
// SERIALIZABLE, 422 for a reused key, a resumable 503 instead of a stored
// 500 after the first phase, dead letters instead of deletion.
//
// A local operation, one that touches only this database (an order
// create), is one transaction: its effect and its record, inserted
// completed with the answer. Nothing to claim, nothing to recover: a crash
// before the commit leaves nothing, and after it the retry is a replay.
//
// An operation with an outside effect (a charge) goes through:
//
//  1. Claim. One atomic statement inserts the (caller, key) record, or finds
//     the existing one. Whoever inserted it owns the operation; nobody ever
//     owns it through a SELECT-then-INSERT.
//  2. Decide, for a request that did not insert: a different fingerprint is
//     a 422; a completed record is replayed byte for byte; one in progress
//     under a live lease is waited for (up to StoreConfig.Wait, then a 409
//     with Retry-After); one whose lease expired (its owner crashed) is
//     taken over, which increments its attempt number.
//  3. Execute, as a chain of atomic phases: each one transaction that does
//     its work and records the next recovery point, or the final response.
//     A request that takes over resumes from the last recovery point.
//
// Fencing: every write after the claim names its attempt (WHERE ... AND
// attempt = $n). An owner that stalled past its lease and was taken over
// finds its writes refused (SQLSTATE RS001), rolls its phase back and
// stops: it can never overwrite the newer owner's result.
//
// Detachment: the record's writes run on a context detached from the
// request's cancellation (bounded by StoreConfig.MaxRun instead), so a
// client that hangs up cannot leave the effect done but unrecorded.
//
// Leases run on the database's clock alone (now() in SQL): skew between
// replicas cannot break them (TestClockSkewCannotBreakALease).
//
// Replays from memory: a completed record never changes until the sweeper
// deletes it, so CacheReplays keeps recent answers in memory, each for
// less than its record is certain to exist (replays.go).
//
// Read it in this order: operation.go, store.go, local.go, claim.go, run.go
// (what a handler's errors mean), lease.go (phases, fencing, the
// heartbeat), wait.go, replays.go, reconciler.go.
package idempotency
