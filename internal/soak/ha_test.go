package soak

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/testdb"
)

// haCluster is a highly available PostgreSQL of the test's own: etcd and
// Patroni-managed nodes started by scripts/ha.sh (make ha) in a temporary
// directory, on loopback ports from testdb.FreePort. Every process it started
// is stopped by its PID when the test ends, failed or not; and if the test
// binary itself is killed, the script's watcher stops them.
type haCluster struct {
	t      *testing.T
	script string
	dir    string
	url    string // the service's DATABASE_URL: every node, target_session_attrs=read-write
}

// startHA starts a cluster of nodes PostgreSQL nodes, with synchronous
// replication when sync is set, and migrates its payments database. It
// needs Patroni and etcd: without them a test is skipped with a hint, and
// fails under CI=true (.ci/run installs them).
func startHA(t *testing.T, nodes int, sync bool) *haCluster {
	t.Helper()
	for _, bin := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := "the failover tests run PostgreSQL under Patroni and etcd, and " + bin + " is not installed: " +
				"`bash scripts/ha.sh install` (Debian: apt-get install patroni etcd-server)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	script, err := filepath.Abs("../../scripts/ha.sh")
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: under root, PostgreSQL runs as the postgres user,
	// which must be able to reach the directory.
	dir, err := os.MkdirTemp("", "soak-ha-")
	if err != nil {
		t.Fatal(err)
	}
	c := &haCluster{t: t, script: script, dir: dir}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Reserved before the stop is registered, so released after it.
	ports := make([]string, 2+2*nodes) // etcd's two, then each node's PostgreSQL and REST API
	for i := range ports {
		ports[i] = testdb.FreePort(t)
	}
	// Registered before the start, so that a start that fails half-way
	// stops what it started too.
	t.Cleanup(func() {
		if t.Failed() {
			for n := 1; n <= nodes; n++ {
				if b, err := os.ReadFile(filepath.Join(dir, "node"+strconv.Itoa(n), "patroni.log")); err == nil {
					t.Logf("node%d's Patroni and PostgreSQL log (the end):\n%s", n, tail(string(b), 60))
				}
			}
		}
		if out, err := c.command("stop", dir).CombinedOutput(); err != nil {
			t.Errorf("stop the cluster: %v\n%s", err, out)
		}
	})
	sync_ := "on"
	if !sync {
		sync_ = "off"
	}
	start := c.command("start", dir)
	start.Env = append(os.Environ(), "HA_PORTS="+strings.Join(ports, " "), "HA_NODES="+strconv.Itoa(nodes), "HA_SYNC="+sync_, "HA_WATCH_PID="+strconv.Itoa(os.Getpid()))
	began := time.Now()
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("start the cluster: %v\n%s", err, out)
	}
	t.Logf("cluster of %d nodes (synchronous replication %s) ready in %s", nodes, sync_, time.Since(began).Round(100*time.Millisecond))
	c.url = c.run("url", dir, "payments")
	migrate(t, c.url) // ha.sh created the database on every node
	return c
}

func (c *haCluster) command(args ...string) *exec.Cmd {
	cmd := exec.Command("bash", append([]string{c.script}, args...)...)
	// The script leaves etcd, Patroni and a watcher running; should one
	// of them keep its output open, Wait must not wait for it for ever.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// run runs a command of the script and returns its output's last line.
func (c *haCluster) run(args ...string) string {
	c.t.Helper()
	out, err := c.command(args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		c.t.Fatalf("ha.sh %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// killLeader kills the leader's Patroni and postmaster with SIGKILL, and
// returns the node and when both were gone (ha.sh waits for that).
func (c *haCluster) killLeader() (node string, at time.Time) {
	node = c.run("kill-leader", c.dir)
	return node, time.Now()
}

// leader is the leader's name.
func (c *haCluster) leader() string { return c.run("leader", c.dir) }

// tryLeader is the leader's name, if there is one.
func (c *haCluster) tryLeader() (string, bool) {
	out, err := c.command("leader", c.dir).Output()
	return strings.TrimSpace(string(out)), err == nil
}

// nodeURL is a URL of node alone, on the payments database.
func (c *haCluster) nodeURL(node string) string { return c.run("node-url", c.dir, node, "payments") }

// rejoin starts node's Patroni again and waits until it streams from the
// leader; it reports whether Patroni rewound the node's data (pg_rewind)
// to get there.
func (c *haCluster) rejoin(node string) (rewound bool) {
	log := filepath.Join(c.dir, node, "patroni.log")
	before, _ := os.ReadFile(log)
	c.run("rejoin", c.dir, node)
	c.run("wait", c.dir)
	after, _ := os.ReadFile(log)
	return strings.Contains(string(after[len(before):]), "pg_rewind exit code=0")
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
