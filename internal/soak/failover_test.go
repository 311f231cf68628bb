package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/payments/client/apiclient"
	"github.com/retrysafe/payments/internal/testdb"
)

var failoverDuration = flag.Duration("soak.failover-duration", 30*time.Second,
	"how long the failover soak's clients send requests at least (make soak-failover: 5m); they go on until the second killed node is back")

// writeTimeout is the replicas' HTTP_WRITE_TIMEOUT in the failover soak: no
// answer may take longer, outage or not.
const writeTimeout = 20 * time.Second

// outage is one leader kill and what followed it.
type outage struct {
	node      string
	killed    time.Time
	recovered time.Time // when keyed writes succeeded again (firstWriteAfter)
	rewound   bool      // the killed node came back through pg_rewind
	// What the clients' attempts that ended between the kill and the
	// recovery were answered.
	unavailable, internal, other, replays, noAnswer, gaveUp int      // unavailable: the database's 503s
	readyz503                                               bool     // /readyz said so during the outage
	failures                                                []string // why connections failed
}

// TestFailoverSoak is the chaos soak's load (orders, charges with every
// fault card, refunds, payouts, duplicates on other replicas, clients that
// hang up; three server replicas, the processor with chaos) against a
// PostgreSQL cluster run by Patroni: three nodes, synchronous replication.
// Twice, the leader is killed (SIGKILL of its Patroni and its postmaster),
// and once a standby has taken over and writes succeed again, the killed
// node is started again and rejoins as a standby (pg_rewind). A sweeper
// runs beside the replicas. Then everything settles and the chaos soak's
// checks run, with this one's: every final answer a client received is
// found again with the same content (nothing acknowledged lost), no
// answer during an outage was a 500 or took longer than the write
// timeout, /readyz said the database was gone, and the replicas (never
// restarted), their reconcilers, relays and payout jobs, and the sweeper
// carried on by themselves. It reports the recovery time of each kill: from
// the kill to the end of the first successful keyed write sent after it.
//
// `go test ./internal/soak` runs it for 30 seconds of load;
// `make soak-failover` for five minutes (-soak.failover-duration).
func TestFailoverSoak(t *testing.T) {
	t.Parallel()
	began := time.Now()
	ha := startHA(t, 3, true)
	clusterReady := time.Since(began)
	db := testdb.Pool(t, ha.url)
	// The write timeout must cover a request's read, its wait for an
	// original and the longest run of an operation (the server checks it):
	// 2s + 1s + (1s + 10s) + 5s, under 20s.
	sv := startServers(t, ha.url, serversConfig{replicas: 3, chaos: true, env: []string{
		"HTTP_WRITE_TIMEOUT=" + writeTimeout.String(), "HTTP_READ_TIMEOUT=2s", "HTTP_READ_HEADER_TIMEOUT=2s", "IDEMPOTENCY_WAIT=1s",
	}})
	sweeperLogs := &syncBuffer{}
	sweeper := &process{name: "sweeper", bin: filepath.Join(sv.bin, "sweeper"), args: []string{"--interval", "500ms"},
		env: []string{"DATABASE_URL=" + ha.url}, logs: sweeperLogs, ready: `"msg":"sweep"`}
	sweeper.start(t)
	s := newSoak(t, sv.urls)
	// Longer than any answer may take, so that one that took too long is
	// seen, not cut short.
	s.attemptTimeout = writeTimeout + 10*time.Second

	// The clients run for the soak's duration and at least until the
	// second killed node is back; the faults take turns with nothing else.
	ctx, stopClients := context.WithCancel(context.Background())
	defer stopClients()
	start := time.Now()
	var outages []*outage
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		for i, at := range []time.Duration{*failoverDuration / 4, *failoverDuration / 2} {
			time.Sleep(time.Until(start.Add(at))) // the schedule of the faults, not a wait for a state
			o := &outage{}
			o.node, o.killed = ha.killLeader()
			outages = append(outages, o)
			deadline := time.Now().Add(90 * time.Second)
			for o.recovered = s.firstWriteAfter(o.killed); o.recovered.IsZero(); o.recovered = s.firstWriteAfter(o.killed) {
				if time.Now().After(deadline) {
					t.Errorf("kill %d (%s): no keyed write succeeded within 90s", i+1, o.node)
					return
				}
				time.Sleep(100 * time.Millisecond) // polling the clients' record
			}
			o.rewound = ha.rejoin(o.node)
		}
	}()
	// /readyz, polled on one replica as an orchestrator would.
	type probe struct {
		at     time.Time
		status int
	}
	var probes []probe
	var probing sync.WaitGroup
	probing.Go(func() {
		for ctx.Err() == nil {
			status := 0
			if res, err := (&http.Client{Timeout: 5 * time.Second}).Get(sv.urls[0] + "/readyz"); err == nil {
				res.Body.Close()
				status = res.StatusCode
			}
			probes = append(probes, probe{time.Now(), status})
			time.Sleep(200 * time.Millisecond) // the probe's period
		}
	})
	go func() {
		<-faultsDone
		time.Sleep(time.Until(start.Add(*failoverDuration))) // the clients' minimum run
		stopClients()
	}()
	s.runClients(ctx)
	probing.Wait()
	load := time.Since(start)
	s.settle(db, sv)

	// The outages, from the clients' record of every attempt.
	var longest time.Duration
	s.mu.Lock()
	attempts := slices.Clone(s.attempts)
	s.mu.Unlock()
	for _, a := range attempts {
		longest = max(longest, a.end.Sub(a.start))
		for _, o := range outages {
			if a.end.Before(o.killed) || o.recovered.IsZero() || a.end.After(o.recovered) {
				continue
			}
			switch {
			case a.code == string(apiclient.ProblemCodeServiceUnavailable):
				o.unavailable++
			case a.status >= 500 && a.status != http.StatusServiceUnavailable: // a processor's 503 is other
				o.internal++
			case a.status >= 200 && a.status < 300 && a.replayed:
				o.replays++
			case a.gaveUp:
				o.gaveUp++
			case a.status == 0:
				o.noAnswer++
				o.failures = append(o.failures, fmt.Sprintf("%s after %s", a.err, a.end.Sub(a.start).Round(time.Millisecond)))
			default:
				o.other++
			}
		}
	}
	for _, p := range probes {
		for _, o := range outages {
			if !p.at.Before(o.killed) && !o.recovered.IsZero() && p.at.Before(o.recovered) && p.status == http.StatusServiceUnavailable {
				o.readyz503 = true
			}
		}
	}
	sweeps, failedSweeps, lastSweep := sweepsOf(t, sweeperLogs.String())

	lines := []string{fmt.Sprintf("cluster             3 nodes (Patroni, etcd), synchronous replication; ready in %s", clusterReady.Round(100*time.Millisecond))}
	for i, o := range outages {
		lines = append(lines, fmt.Sprintf("leader kill %d       %s: recovered in %s (kill -> first new keyed write); meanwhile %d answers 503 service_unavailable, %d 5xx other than 503, %d replays, %d other answers, %d connections that failed, %d clients that gave up; /readyz 503: %v; rejoined by pg_rewind: %v",
			i+1, o.node, o.recovered.Sub(o.killed).Round(10*time.Millisecond), o.unavailable, o.internal, o.replays, o.other, o.noAnswer, o.gaveUp, o.readyz503, o.rewound))
	}
	lines = append(lines,
		fmt.Sprintf("slowest answer      %s (HTTP_WRITE_TIMEOUT %s)", longest.Round(10*time.Millisecond), writeTimeout),
		fmt.Sprintf("sweeper             %d sweeps, %d failed (the database was away), the last at %s", sweeps, failedSweeps, lastSweep.Format(time.TimeOnly)))
	s.report(fmt.Sprintf("failover soak: %s of load, %d clients, 3 replicas, %s", load.Round(time.Second), *workers, chaosSummary), lines...)

	if len(outages) != 2 {
		t.Fatalf("%d leader kills; want 2", len(outages))
	}
	for i, o := range outages {
		if o.internal > 0 || o.noAnswer > 0 {
			t.Errorf("kill %d: %d answers were 5xx other than 503, and %d connections failed (%q), while there was no leader", i+1, o.internal, o.noAnswer, o.failures)
		}
		// A kill that cost under two seconds (seen once: the leader found
		// while the lock was moving, writes back 620 ms later) can pass
		// between the probe's polls: only a longer outage must be seen.
		if o.recovered.Sub(o.killed) < 2*time.Second {
			continue
		}
		if !o.readyz503 {
			t.Errorf("kill %d: /readyz never answered 503 while there was no leader", i+1)
		}
		if o.unavailable == 0 {
			t.Errorf("kill %d: no answer was a 503: the outage did not reach the clients", i+1)
		}
	}
	if longest >= writeTimeout {
		t.Errorf("an answer took %s, longer than the write timeout %s", longest, writeTimeout)
	}
	for _, r := range sv.replicas {
		if !r.running() {
			t.Errorf("%s exited; the replicas must ride through a failover without a restart", r.name)
		}
	}
	if !sweeper.running() || lastSweep.Before(outages[len(outages)-1].recovered) {
		t.Errorf("the sweeper's last successful sweep was at %s, before the last recovery (running: %v)", lastSweep.Format(time.TimeOnly), sweeper.running())
	}
	if len(s.ops) < 20 || failedSweeps == 0 {
		t.Errorf("the soak did too little to show anything: %d keyed requests, %d failed sweeps", len(s.ops), failedSweeps)
	}
}

// firstWriteAfter is when the database took keyed writes again after an
// outage that began at t: the end of the first new (not replayed) success
// of a keyed request sent after the first attempt since t failed (a 503
// service_unavailable, the database's: not the processor's chaos, or a
// connection that failed); zero if there is none yet. (For a moment
// after its postmaster is killed, the old leader's backends may still
// commit, their standby acknowledging: those writes are not the recovery.)
func (s *soak) firstWriteAfter(t time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var failed, first time.Time
	for _, a := range s.attempts {
		if a.start.After(t) && (a.code == string(apiclient.ProblemCodeServiceUnavailable) || (a.status == 0 && !a.gaveUp)) && (failed.IsZero() || a.end.Before(failed)) {
			failed = a.end
		}
	}
	if failed.IsZero() {
		return time.Time{}
	}
	for _, a := range s.attempts {
		if a.start.After(failed) && a.status >= 200 && a.status < 300 && !a.replayed && (first.IsZero() || a.end.Before(first)) {
			first = a.end
		}
	}
	return first
}

// sweepsOf counts the sweeps a sweeper logged, those that failed, and
// when the last successful one was.
func sweepsOf(t *testing.T, logs string) (sweeps, failed int, lastOK time.Time) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
			Err  any       `json:"err"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "sweep" {
			continue
		}
		sweeps++
		if line.Err != nil {
			failed++
			continue
		}
		if line.Time.After(lastOK) {
			lastOK = line.Time
		}
	}
	if sweeps == 0 {
		t.Error("the sweeper logged no sweep")
	}
	return sweeps, failed, lastOK
}
