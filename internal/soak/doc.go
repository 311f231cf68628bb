// Package soak holds no code: its test is the chaos soak (make soak). Three
// server processes share one database, the fake processor runs as its own
// process with chaos on, and clients using the project's Go client run
// logical operations (an order, a charge, sometimes a partial refund,
// sometimes a payout from the balance, sometimes a cancel racing the
// charge) with concurrent duplicates of one key sent to different replicas
// and clients that hang up mid-request, while a random replica is killed
// with SIGKILL every few seconds and restarted, and the database (a
// PostgreSQL of the soak's own) is restarted once in the middle, stopped
// as a crash would stop it. Then it settles and checks the guarantees
// from the outside: one final answer per key, byte-identical on every
// replica; one processor effect per succeeded charge, refund or payout and
// none without a local record; money conserved, in the ledger and in the
// balance; nothing left in progress, no job discarded; no panic, 500 or
// secret in the logs.
//
// `go test ./internal/soak` (and so `make test` and CI) runs it for 40
// seconds; `make soak` runs it for 10 minutes (-soak.duration).
package soak
