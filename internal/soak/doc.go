// Package soak holds no code: its tests run the service's programs as
// processes and check its guarantees from the outside. docs/reliability.md
// says what each proves and how to run it longer: the chaos soak (TestSoak,
// make soak), the failover soak under Patroni (TestFailoverSoak, make
// soak-failover), the history check that must fail on a planted bug
// (TestHistoryCheckFindsUnfencedCompletion), and what a failover under
// asynchronous replication loses
// (TestAsyncFailoverLosesAcknowledgedWritesButChargesOnce). `go test
// ./internal/soak` runs the chaos soak for 15 seconds of load, and the
// failover soak until both killed leaders are back; the failover tests
// need Patroni and etcd (bash scripts/ha.sh install).
package soak
