package soak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/retrysafe/payments/internal/postgres"
	"github.com/retrysafe/payments/internal/testdb"
)

// cluster is a PostgreSQL server of the soak's own: initdb'd into a
// temporary directory, on its own port, so that the soak can restart it in
// the middle of the run (the clients' connections break, new ones are
// refused until it is back, and it replays its WAL on the way up) without
// touching the machine's PostgreSQL, which the rest of the suite uses at
// the same time.
type cluster struct {
	bin  string // the directory of initdb, pg_ctl and postgres
	dir  string // the data directory, which also holds the socket and the log
	port string
	// as runs the server's commands as a user PostgreSQL accepts: it
	// refuses to run as root, so under root (CI, containers) they run as
	// the postgres user.
	as []string
}

// soakDatabase returns the soak's database and how to restart it. That is
// a cluster of its own when PostgreSQL's server binaries are here. Where
// they are not (PostgreSQL runs in a container, say), the soak falls back
// to the machine's server and to dropping every connection to its
// database, which is what a restart does to the clients but not to the
// server; in CI that fallback is a failure.
func soakDatabase(t *testing.T) (url string, restart func() error, fault string) {
	t.Helper()
	if bin := pgBin(); bin != "" {
		c := newCluster(t, bin)
		return c.url(), c.restart, "database restarts (immediate: a crash)"
	}
	msg := "the soak restarts a PostgreSQL of its own and needs the server's binaries (initdb, pg_ctl, postgres): " +
		"put them on PATH or set SOAK_PG_BIN to their directory"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Logf("%s; without them it only drops every connection to its database", msg)
	url = testdb.New(t)
	db := testdb.Pool(t, url)
	return url, func() error {
		_, err := db.Exec(context.Background(),
			`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		return err
	}, "drops of every database connection"
}

// newCluster initialises and starts a PostgreSQL from the binaries in bin,
// and migrates its database.
func newCluster(t *testing.T, bin string) *cluster {
	t.Helper()
	c := &cluster{bin: bin, port: freePort(t)}
	dir, err := os.MkdirTemp("", "soak-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the soak's PostgreSQL needs the postgres user to run as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.as = []string{"runuser", "-u", "postgres", "--"}
	}
	c.run(t, "initdb", "-D", dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	// Stopped before its directory is removed, even if it never finished
	// starting.
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(c.log()); err == nil {
				t.Logf("the soak's PostgreSQL log:\n%s", b)
			}
		}
		_ = c.command("pg_ctl", "-D", dir, "-m", "immediate", "stop").Run()
	})
	c.run(t, "pg_ctl", "-D", dir, "-l", c.log(), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %s -k %s -c listen_addresses=127.0.0.1 -c max_connections=200", c.port, dir), "start")

	migrate(t, c.url())
	return c
}

// migrate applies the migrations to the database at url.
func migrate(t *testing.T, url string) {
	t.Helper()
	pool, err := postgres.Open(context.Background(), url, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(pool); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) url() string {
	return "postgres://postgres@127.0.0.1:" + c.port + "/postgres?sslmode=disable"
}

// restart stops the server the way a crash does (immediate: no checkpoint,
// every backend killed at once) and starts it again, waiting until it
// accepts connections, after it has replayed its WAL. Every committed
// transaction must survive that; the soak's checks find any that did not.
func (c *cluster) restart() error {
	return c.command("pg_ctl", "-D", c.dir, "-l", c.log(), "-m", "immediate", "-w", "-t", "60", "restart").Run()
}

func (c *cluster) log() string { return filepath.Join(c.dir, "server.log") }

func (c *cluster) run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := c.command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func (c *cluster) command(name string, args ...string) *exec.Cmd {
	argv := append(slices.Clone(c.as), filepath.Join(c.bin, name))
	cmd := exec.Command(argv[0], append(argv[1:], args...)...)
	cmd.Dir = c.dir // a directory the postgres user may enter
	return cmd
}

// pgBin finds PostgreSQL's server binaries: SOAK_PG_BIN, else pg_ctl's
// directory on PATH, else the newest /usr/lib/postgresql/*/bin (Debian's
// layout); "" if there are none.
func pgBin() string {
	if dir := os.Getenv("SOAK_PG_BIN"); dir != "" {
		return dir
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(a) - versionOf(b) })
	if len(dirs) > 0 {
		return dirs[len(dirs)-1]
	}
	return ""
}

// versionOf reads 15 from /usr/lib/postgresql/15/bin.
func versionOf(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}
