// Package soak holds no code: its tests run the service's programs as
// processes and check its guarantees from the outside.
//
// TestSoak is the chaos soak (make soak). Three server processes share one
// database and the fake processor runs as its own process with chaos on.
// Clients (the project's Go client) run logical operations: an order, a
// charge, sometimes a partial refund, a payout from the balance or a cancel
// racing the charge, with concurrent duplicates of one key sent to
// different replicas, and clients that hang up mid-request. Every few
// seconds a random replica is killed with SIGKILL and restarted; once, the
// database (a PostgreSQL of the soak's own) is restarted as a crash would
// stop it. Then it settles and checks: one final answer per key,
// byte-identical on every replica; every final answer a client received
// found again, naming the same object with the same content; one processor
// effect per succeeded charge, refund or payout, and none without a local
// record; money conserved, in the ledger and the balance; nothing left in
// progress, no job discarded, every event delivered; no panic, 500 or
// secret in the logs. Every keyed request it sent (each attempt, a hung-up
// client's, the final replays), with when it was sent and answered and
// how, is checked with porcupine for linearizability against a model of
// the contract, one (caller, key) at a time (history_test.go): a key no
// order of its requests explains fails the soak, and porcupine's drawing
// of it is written next to the report. The report gives the operations and
// keys checked, the check's time, and the p99 and maximum time from a
// key's first request to its first final answer.
//
// TestFailoverSoak (make soak-failover) runs the same load against a
// highly available PostgreSQL: three nodes under Patroni and etcd
// (scripts/ha.sh), with synchronous replication. Twice it kills the leader
// (its Patroni and postmaster, with SIGKILL) and, once writes succeed on
// the new leader, brings the killed node back as a standby (pg_rewind). It
// measures each kill's recovery time and checks that nothing acknowledged
// was lost, that no answer meanwhile was a 500 or slower than the write
// timeout, that /readyz said the database was gone, and that the replicas,
// their background workers and a sweeper carried on without a restart.
//
// TestHistoryCheckFindsUnfencedCompletion shows that the history check
// fails when it must: a short soak on servers started with
// FAULT_UNFENCED_COMPLETION=true (the completion written without its
// fence), whose owners stall past their leases (FAULT_STALL_POINTS), is
// not linearizable; the same soak without it is.
//
// TestAsyncFailoverLosesAcknowledgedWritesButChargesOnce shows what a
// failover under asynchronous replication loses (acknowledged
// transactions), and that even then no card is charged and no payout paid
// twice.
//
// `go test ./internal/soak` (and so `make test` and CI) runs the chaos soak
// for 40 seconds and the failover soak for 30 seconds of load (more, until
// both killed nodes are back); `make soak` and `make soak-failover` run
// them for 10 and 5 minutes (-soak.duration, -soak.failover-duration). The
// failover tests need Patroni and etcd (`bash scripts/ha.sh install`):
// without them they skip, except under CI=true, where they fail.
package soak
