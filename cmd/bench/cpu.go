package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CPU per request, by process, from /proc/<pid>/stat (utime + stime, all
// threads, in clock ticks): read before and after every turn of a phase,
// and divided by the requests the phase completed.
//
//   - server: the process that answered the phase's requests (the service,
//     the cache-off service or a bare hop); none for the floor;
//   - postgres: the bench database's client backends (pg_stat_activity),
//     whichever connection served the phase; PostgreSQL's own processes
//     (WAL writer, checkpointer, autovacuum) are left out, being shared with
//     every other database on the machine;
//   - client: this process, the load generator (fasthttp's client over
//     HTTP; for the floor, pgx, which is then where the statements are
//     issued from).
//
// A tick is 10 ms (USER_HZ is 100), and each reading is short of the truth
// by less than a tick, so a turn's figure is off by less than a tick
// either way. For the server, over a 10 s phase at 2,000 requests/s
// (20,000 requests in twelve turns), that is under 12 × 10 ms / 20,000 =
// 6 µs per request at worst, far less in practice (the errors have no
// sign and mostly cancel); the backends' errors are independent and
// mostly cancel too (about √20 ticks a turn for 20 of them). Small beside
// the figures compared, tens to hundreds of µs.

// meter reads the CPU time of the processes a phase involves.
type meter struct {
	pool *pgxpool.Pool // to list the bench database's backends
	tick time.Duration
	off  bool // no /proc (not Linux): nothing is measured
}

func newMeter(pool *pgxpool.Pool) *meter {
	m := &meter{pool: pool, tick: 10 * time.Millisecond}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		m.off = true
		return m
	}
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		if hz, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && hz > 0 {
			m.tick = time.Second / time.Duration(hz)
		}
	}
	return m
}

// cpuUsage is CPU time spent by each kind of process, and the server's
// read and write system calls.
type cpuUsage struct {
	server, postgres, client time.Duration
	serverIO                 ioCalls
}

func (u *cpuUsage) add(v cpuUsage) {
	u.server += v.server
	u.postgres += v.postgres
	u.client += v.client
	u.serverIO.reads += v.serverIO.reads
	u.serverIO.writes += v.serverIO.writes
}

// ioCalls counts a process's read and write system calls (read, write
// and their vectored and positioned kinds: syscr and syscw in
// /proc/<pid>/io; not epoll_wait, futex or the scheduler's calls). Unlike
// CPU time they are exact and free of the machine's noise: a server that
// makes one more write per request than another shows it in every run.
// (That is how the service's log line, written alone for every request,
// was found: docs/performance.md.)
type ioCalls struct{ reads, writes int64 }

// cpuReading is the processes' CPU time at one moment.
type cpuReading struct {
	server, client time.Duration
	serverIO       ioCalls
	backends       map[int]time.Duration
}

// read reads the CPU time of server (0: none), of the bench database's
// backends and of this process.
func (m *meter) read(ctx context.Context, server int) (cpuReading, error) {
	var r cpuReading
	var err error
	if m.off {
		return r, nil
	}
	if server != 0 {
		if r.server, err = m.procCPU(server); err != nil {
			return r, err
		}
		if r.serverIO, err = procIO(server); err != nil {
			return r, err
		}
	}
	if r.client, err = m.procCPU(os.Getpid()); err != nil {
		return r, err
	}
	rows, err := m.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'`)
	if err != nil {
		return r, err
	}
	defer rows.Close()
	r.backends = map[int]time.Duration{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return r, err
		}
		if t, err := m.procCPU(pid); err == nil { // a backend may have just gone
			r.backends[pid] = t
		}
	}
	return r, rows.Err()
}

// since is what was spent from r0 to r1. A backend that appeared in between
// counts whole; one that went away in between is lost (the pools keep
// their connections for the whole run).
func since(r0, r1 cpuReading) cpuUsage {
	u := cpuUsage{server: r1.server - r0.server, client: r1.client - r0.client, serverIO: ioCalls{
		reads:  r1.serverIO.reads - r0.serverIO.reads,
		writes: r1.serverIO.writes - r0.serverIO.writes,
	}}
	for pid, t := range r1.backends {
		u.postgres += t - r0.backends[pid]
	}
	return u
}

// procCPU is pid's utime + stime.
func (m *meter) procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count the fields
	// after its closing parenthesis, where field 3 (state) starts.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(utime+stime) * m.tick, nil
}

// procIO is pid's read and write system calls so far. The server is this
// process's child, run as the same user, so its /proc/<pid>/io is ours to
// read.
func procIO(pid int) (ioCalls, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return ioCalls{}, err
	}
	var c ioCalls
	var found int
	for line := range strings.Lines(string(b)) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), ": ")
		n, err := strconv.ParseInt(value, 10, 64)
		switch {
		case name != "syscr" && name != "syscw":
			continue
		case err != nil:
			return ioCalls{}, fmt.Errorf("/proc/%d/io: %q", pid, line)
		case name == "syscr":
			c.reads = n
		default:
			c.writes = n
		}
		found++
	}
	if found != 2 {
		return ioCalls{}, fmt.Errorf("/proc/%d/io: no syscr and syscw in %q", pid, b)
	}
	return c, nil
}
