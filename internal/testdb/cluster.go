package testdb

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
)

// Cluster is a PostgreSQL server of a test's own: initdb'd into a
// temporary directory, on its own port, for a test that must do to the
// server what the suite's shared one cannot have done to it: the soak
// restarts it as a crash would, the clock test moves its clock (WithClock).
type Cluster struct {
	bin  string // the directory of initdb, pg_ctl and postgres
	dir  string // the data directory, which also holds the socket and the log
	port string
	// as runs the server's commands as a user PostgreSQL accepts: it
	// refuses to run as root, so under root (CI, containers) they run as
	// the postgres user. Then the wrapper (faketime), if any.
	as []string
}

// ClusterOption changes how NewCluster starts the server, after initdb.
type ClusterOption func(testing.TB, *Cluster)

// WithClock starts the server under libfaketime (see FaketimeLib), with
// its clock moved by offset, a faketime spec such as "+10m": every now()
// the database computes is that far from every other process's clock.
func WithClock(offset string) ClusterOption {
	return func(t testing.TB, c *Cluster) {
		lib := FaketimeLib()
		if lib == "" {
			t.Fatal("WithClock needs libfaketime (apt-get install faketime)")
		}
		// The library itself, not the faketime command: the command
		// waits for the server pg_ctl leaves running, so pg_ctl start
		// would never return. pg_ctl starts the server, which forks a
		// process per connection: each inherits the LD_PRELOAD.
		c.as = append(c.as, "env", "LD_PRELOAD="+lib, "FAKETIME="+offset)
	}
}

// NewCluster initialises and starts a PostgreSQL from the binaries in bin
// (see PGBin), stopped when t ends. Its database is empty: the caller
// migrates it.
func NewCluster(t testing.TB, bin string, opts ...ClusterOption) *Cluster {
	t.Helper()
	c := &Cluster{bin: bin, port: FreePort(t)}
	dir, err := os.MkdirTemp("", "test-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, a test's PostgreSQL needs the postgres user to run as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.as = []string{"runuser", "-u", "postgres", "--"}
	}
	c.run(t, "initdb", "-D", dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	for _, opt := range opts {
		opt(t, c)
	}
	// Stopped before its directory is removed, even if it never started.
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(c.log()); err == nil {
				t.Logf("the test's PostgreSQL log:\n%s", b)
			}
		}
		_ = c.command("pg_ctl", "-D", dir, "-m", "immediate", "stop").Run()
	})
	c.run(t, "pg_ctl", "-D", dir, "-l", c.log(), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %s -k %s -c listen_addresses=127.0.0.1 -c max_connections=200", c.port, dir), "start")
	return c
}

// URL is the cluster's postgres database.
func (c *Cluster) URL() string {
	return "postgres://postgres@127.0.0.1:" + c.port + "/postgres?sslmode=disable"
}

// Restart stops the server the way a crash does (immediate: no checkpoint,
// every backend killed at once) and starts it again, waiting until it
// accepts connections, after it has replayed its WAL.
func (c *Cluster) Restart() error {
	return c.command("pg_ctl", "-D", c.dir, "-l", c.log(), "-m", "immediate", "-w", "-t", "60", "restart").Run()
}

func (c *Cluster) log() string { return filepath.Join(c.dir, "server.log") }

func (c *Cluster) run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := c.command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	argv := append(slices.Clone(c.as), filepath.Join(c.bin, name))
	cmd := exec.Command(argv[0], append(argv[1:], args...)...) // #nosec G204 -- a test helper: PostgreSQL's own binaries (PGBin), with arguments built here
	// A directory the postgres user may enter.
	cmd.Dir = c.dir
	return cmd
}

// PGBin finds PostgreSQL's server binaries: SOAK_PG_BIN, else pg_ctl's
// directory on PATH, else the newest /usr/lib/postgresql/*/bin (Debian's
// layout); "" if there are none.
func PGBin() string {
	if dir := os.Getenv("SOAK_PG_BIN"); dir != "" {
		return dir
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(dirs) == 0 {
		return ""
	}
	return slices.MaxFunc(dirs, func(a, b string) int { return versionOf(a) - versionOf(b) })
}

// FaketimeLib finds libfaketime (Debian's faketime package installs it
// under /usr/lib/<arch>/faketime); "" if it is not here.
func FaketimeLib() string {
	for _, pattern := range []string{"/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1"} {
		if found, _ := filepath.Glob(pattern); len(found) > 0 {
			return found[0]
		}
	}
	return ""
}

// versionOf reads 15 from /usr/lib/postgresql/15/bin.
func versionOf(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// FreePort is a loopback TCP port nobody listens on now, below Linux's
// ephemeral range (which outgoing connections take ports from). It stays
// reserved until t ends by a lock on a file named after it, taken first by
// every test process: a server binds its port seconds after the probe.
func FreePort(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "retrysafe-test-ports")
	_ = os.MkdirAll(dir, 0o700) // if it fails, so does OpenFile
	for {
		port := strconv.Itoa(16384 + rand.IntN(16384)) // #nosec G404 -- spreads tests over ports; nothing depends on it being unpredictable
		f, err := os.OpenFile(filepath.Join(dir, port), os.O_CREATE|os.O_RDONLY, 0o600) // #nosec G304 -- a number under our own directory
		if err != nil {
			t.Fatal(err)
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			if ln, err := net.Listen("tcp", "127.0.0.1:"+port); err == nil {
				_ = ln.Close() // only probing
				t.Cleanup(func() { _ = f.Close() })
				return port
			}
		}
		_ = f.Close()
	}
}

// Build builds the module's commands (such as "cmd/server") into dir as the
// Dockerfile does (no cgo, -trimpath, -ldflags="-s -w"), so that every test
// that starts a command shares one set of compiled packages in the build
// cache.
func Build(dir string, cmds ...string) error {
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", dir + "/"}
	for _, c := range cmds {
		args = append(args, "github.com/retrysafe/payments/"+c)
	}
	cmd := exec.Command("go", args...) // #nosec G204 -- a test helper: the go tool, building this module's commands
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}
