package config_test

// The deployment test checks the container files at the
// repository's root (Dockerfile, docker-compose.yml) against the programs
// they run. No container engine on our machines can pull images, so the
// test checks what can be checked without one:
//
//   - every service's command is a binary the Dockerfile builds, and each
//     of those binaries builds as a static (cgo-free) binary;
//   - every environment variable a service sets is one its program reads,
//     through the same configuration code the program uses, and the values
//     pass that code's checks;
//   - the hosts and ports line up: the published port is the one the
//     server listens on, the processor and database URLs name those
//     services on their ports, the webhooks go to the server's port, and
//     each health check asks its own service's port;
//   - each service's command, with its environment (service names mapped
//     to local addresses), really starts: the migration finishes, the
//     processor and the server listen and answer their health checks, the
//     sweeper sweeps.

import (
	"bufio"
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/retrysafe/payments/internal/config"
	"github.com/retrysafe/payments/internal/fakeprocessor"
	"github.com/retrysafe/payments/internal/testdb"
)

// compose is the part of docker-compose.yml the test reads.
type compose struct {
	Services map[string]struct {
		Build       any               `yaml:"build"`
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// dockerfileBinaries are the ./cmd/... packages the Dockerfile builds.
func dockerfileBinaries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var bins []string
	for _, m := range regexp.MustCompile(`\./cmd/([a-z]+)`).FindAllStringSubmatch(string(b), -1) {
		bins = append(bins, m[1])
	}
	if len(bins) == 0 {
		t.Fatal("the Dockerfile builds no ./cmd/... binary")
	}
	return bins
}

// readBy returns the environment variables a program's configuration code
// reads, by running it on an empty environment and recording the names.
func readBy(load func(getenv func(string) string)) map[string]bool {
	names := map[string]bool{}
	load(func(name string) string { names[name] = true; return "" })
	return names
}

var programs = map[string]map[string]bool{
	"server":    readBy(func(g func(string) string) { _, _ = config.Load(g) }),
	"sweeper":   readBy(func(g func(string) string) { _, _ = config.LoadSweeper(g) }),
	"processor": readBy(func(g func(string) string) { _, _ = fakeprocessor.LoadConfig(g) }),
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	final := df[strings.LastIndex(df, "\nFROM "):]
	for _, want := range []string{"CGO_ENABLED=0", "USER nonroot", "HEALTHCHECK", "distroless/static"} {
		if !strings.Contains(df, want) {
			t.Errorf("the Dockerfile has no %q", want)
		}
	}
	if !strings.Contains(final, "USER nonroot") || !strings.Contains(final, "HEALTHCHECK") {
		t.Error("the final stage must run as a non-root user and have a HEALTHCHECK")
	}
	// Every binary builds, static, as the Dockerfile builds it.
	binaries(t)
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the Dockerfile's binaries as it does (no cgo, so
// static), once per test run, and returns their directory.
func binaries(t *testing.T) string {
	t.Helper()
	bins := dockerfileBinaries(t)
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "payments-image-")
		if buildErr != nil {
			return
		}
		cmds := make([]string, len(bins))
		for i, b := range bins {
			cmds[i] = "cmd/" + b
		}
		buildErr = testdb.Build(binDir, cmds...)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func TestComposeNamesOnlyWhatTheProgramsAccept(t *testing.T) {
	t.Parallel()
	c := readCompose(t)
	bins := dockerfileBinaries(t)
	for _, want := range []string{"db", "migrate", "processor", "server", "sweeper"} {
		if _, ok := c.Services[want]; !ok {
			t.Errorf("no %s service", want)
		}
	}
	for name, svc := range c.Services {
		if svc.Build == nil {
			continue // an image from elsewhere (postgres)
		}
		if len(svc.Command) == 0 || !slices.Contains(bins, svc.Command[0]) {
			t.Errorf("%s: command %q is not a binary of the image (%v)", name, svc.Command, bins)
			continue
		}
		known := programs[svc.Command[0]]
		for v := range svc.Environment {
			if !known[v] {
				t.Errorf("%s: %s sets %s, which %s does not read", name, svc.Command[0], v, svc.Command[0])
			}
		}
		// The values pass the program's own checks.
		getenv := func(k string) string { return svc.Environment[k] }
		var err error
		switch svc.Command[0] {
		case "server":
			_, err = config.Load(getenv)
		case "sweeper":
			_, err = config.LoadSweeper(getenv)
		case "processor":
			_, err = fakeprocessor.LoadConfig(getenv)
		}
		if err != nil {
			t.Errorf("%s: its environment is refused: %v", name, err)
		}
	}
}

// port returns the port of a listen address (":8080") or URL.
func port(t *testing.T, addr string) string {
	t.Helper()
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	return p
}

func host(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Hostname()
}

func TestComposePortsLineUp(t *testing.T) {
	t.Parallel()
	c := readCompose(t)
	server, proc, db := c.Services["server"], c.Services["processor"], c.Services["db"]
	serverPort := port(t, server.Environment["HTTP_ADDR"])
	processorPort := port(t, proc.Environment["PROCESSOR_ADDR"])

	if len(server.Ports) != 1 || !strings.HasSuffix(server.Ports[0], ":"+serverPort) {
		t.Errorf("server publishes %v; want its HTTP_ADDR port %s", server.Ports, serverPort)
	}
	if !strings.HasPrefix(server.Ports[0], "127.0.0.1:8080:") {
		t.Errorf("server publishes %v; the README promises localhost:8080", server.Ports)
	}
	if u := server.Environment["PROCESSOR_URL"]; host(t, u) != "processor" || port(t, u) != processorPort {
		t.Errorf("PROCESSOR_URL %s; want the processor service on %s", u, processorPort)
	}
	if u := proc.Environment["WEBHOOK_URL"]; host(t, u) != "server" || port(t, u) != serverPort {
		t.Errorf("WEBHOOK_URL %s; want the server service on %s", u, serverPort)
	}
	for _, name := range []string{"migrate", "server", "sweeper"} {
		u := c.Services[name].Environment["DATABASE_URL"]
		if host(t, u) != "db" || port(t, u) != "5432" {
			t.Errorf("%s: DATABASE_URL %s; want the db service on 5432", name, u)
		}
		if c.Services[name].DependsOn["db"].Condition == "" && c.Services[name].DependsOn["migrate"].Condition != "service_completed_successfully" {
			t.Errorf("%s starts before the database is migrated", name)
		}
	}
	if !slices.Contains(db.Healthcheck.Test, "pg_isready") {
		t.Error("the database has no health check")
	}
	for name, want := range map[string]string{"server": serverPort, "processor": processorPort} {
		hc := c.Services[name].Healthcheck.Test
		if len(hc) != 3 || hc[1] != "/usr/local/bin/healthcheck" || port(t, hc[2]) != want {
			t.Errorf("%s's health check %v; want the healthcheck binary on its own port %s", name, hc, want)
		}
	}
}

// TestComposeServicesStart runs each service's command with its
// environment, the service names mapped to local addresses: the programs
// accept them and come up.
func TestComposeServicesStart(t *testing.T) {
	t.Parallel()
	c := readCompose(t)
	bin := binaries(t)
	dbURL := testdb.New(t)
	serverPort, processorPort := testdb.FreePort(t), testdb.FreePort(t)
	local := strings.NewReplacer(
		"postgres://postgres@db:5432/payments?sslmode=disable&pool_max_conns=20", dbURL,
		"http://processor:8081", "http://127.0.0.1:"+processorPort,
		"http://server:8080", "http://127.0.0.1:"+serverPort,
		":8081", "127.0.0.1:"+processorPort,
		":8080", "127.0.0.1:"+serverPort,
	)
	env := func(service string) []string {
		var out []string
		for k, v := range c.Services[service].Environment {
			out = append(out, k+"="+local.Replace(v))
		}
		return out
	}
	start := func(service, waitFor string) *exec.Cmd {
		svc := c.Services[service]
		cmd := exec.Command(filepath.Join(bin, svc.Command[0]), svc.Command[1:]...)
		cmd.Env = append(os.Environ(), env(service)...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		seen := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			found := false
			for sc.Scan() {
				if !found && strings.Contains(sc.Text(), waitFor) {
					found = true
					seen <- true
				}
			}
			if !found {
				seen <- false
			}
		}()
		select {
		case ok := <-seen:
			if !ok {
				t.Fatalf("%s exited without logging %q", service, waitFor)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s did not log %q within 60s", service, waitFor)
		}
		return cmd
	}

	// The one-shot migration finishes (the others wait for it).
	migrate := c.Services["migrate"]
	cmd := exec.Command(filepath.Join(bin, migrate.Command[0]), migrate.Command[1:]...)
	cmd.Env = append(os.Environ(), env("migrate")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	start("processor", `"listening"`)
	start("server", `"listening"`)
	start("sweeper", `"sweep"`)
	for service, p := range map[string]string{"server": serverPort, "processor": processorPort} {
		hc := c.Services[service].Healthcheck.Test
		u := strings.Replace(hc[2], "127.0.0.1:"+port(t, hc[2]), "127.0.0.1:"+p, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for {
			err := exec.CommandContext(ctx, filepath.Join(bin, "healthcheck"), u).Run()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s's health check %s: %v", service, u, err)
			}
			time.Sleep(100 * time.Millisecond) // polling the service as Docker would
		}
		cancel()
	}
}
