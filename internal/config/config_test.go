package config

import (
	"strings"
	"testing"
	"time"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// The defaults are a valid configuration, and demo features stay off.
func TestDefaultsAreValid(t *testing.T) {
	t.Parallel()
	cfg, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Lease != DefaultLease || cfg.Retention != DefaultRetention || cfg.WriteTimeout <= cfg.ReadTimeout+cfg.Lease+CleanupAllowance {
		t.Errorf("defaults %+v break their own rules", cfg)
	}
	if cfg.DemoMode {
		t.Error("DEMO_MODE is on by default; it must be off everywhere but make run")
	}
	if _, err := LoadSweeper(env(nil)); err != nil {
		t.Errorf("sweeper defaults: %v", err)
	}
	if cfg.HTTPAddr != ":8080" || len(cfg.CORSAllowedOrigins) != 0 {
		t.Errorf("HTTPAddr %q, CORS %v; want :8080 and no CORS", cfg.HTTPAddr, cfg.CORSAllowedOrigins)
	}
}

// The demo crashes and moves money on request: it listens on loopback
// unless HTTP_ADDR says otherwise.
func TestDemoListensOnLoopback(t *testing.T) {
	t.Parallel()
	cfg, err := Load(env(map[string]string{"DEMO_MODE": "true"}))
	if err != nil || cfg.HTTPAddr != "127.0.0.1:8080" {
		t.Errorf("demo HTTPAddr %q, %v; want 127.0.0.1:8080", cfg.HTTPAddr, err)
	}
	cfg, err = Load(env(map[string]string{"DEMO_MODE": "true", "HTTP_ADDR": ":9000", "CORS_ALLOWED_ORIGINS": "https://a.example, https://b.example"}))
	if err != nil || cfg.HTTPAddr != ":9000" || len(cfg.CORSAllowedOrigins) != 2 || cfg.CORSAllowedOrigins[1] != "https://b.example" {
		t.Errorf("HTTPAddr %q, CORS %q, %v; want what was set", cfg.HTTPAddr, cfg.CORSAllowedOrigins, err)
	}
}

// Every invalid variable is reported at once, each by name.
func TestEveryProblemIsReported(t *testing.T) {
	t.Parallel()
	_, err := Load(env(map[string]string{
		"IDEMPOTENCY_LEASE":       "soon",
		"MAX_BODY_BYTES":          "0",
		"RELAY_ENABLED":           "maybe",
		"RECONCILER_MAX_ATTEMPTS": "-1",
	}))
	for _, name := range []string{"IDEMPOTENCY_LEASE", "MAX_BODY_BYTES", "RELAY_ENABLED", "RECONCILER_MAX_ATTEMPTS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
}

// The rules between settings.
func TestRulesBetweenSettings(t *testing.T) {
	t.Parallel()
	for name, vars := range map[string]map[string]string{
		"HTTP_WRITE_TIMEOUT":        {"HTTP_WRITE_TIMEOUT": "39s"}, // 10s read + 5s wait + (10s processor + 10s) run + 5s cleanup = 40s
		"PROCESSOR_TIMEOUT":         {"PROCESSOR_TIMEOUT": "50s"},
		"IDEMPOTENCY_KEY_RETENTION": {"IDEMPOTENCY_KEY_RETENTION": "5s"},
		"IDEMPOTENCY_LEASE":         {"IDEMPOTENCY_LEASE": "500ms"},
		"IDEMPOTENCY_WAIT":          {"IDEMPOTENCY_WAIT": "-1s"},
		"RECONCILER_MAX_AGE":        {"RECONCILER_MAX_AGE": "25h"},
		"HTTP_READ_HEADER_TIMEOUT":  {"HTTP_READ_HEADER_TIMEOUT": "11s"},
	} {
		if _, err := Load(env(vars)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v; want an error naming %s", vars, err, name)
		}
	}
	if _, err := Load(env(map[string]string{"HTTP_WRITE_TIMEOUT": "41s"})); err != nil {
		t.Errorf("a write timeout just long enough: %v", err)
	}
	if cfg, err := Load(env(map[string]string{"IDEMPOTENCY_WAIT": "0"})); err != nil || cfg.IdempotencyWait != 0 {
		t.Errorf("IDEMPOTENCY_WAIT=0 (answer 409 at once): %v, %v", cfg.IdempotencyWait, err)
	}
}

// The sweeper reads only its own settings and the window's rules: what
// only the server uses cannot stop it.
func TestSweeperIgnoresServerOnlySettings(t *testing.T) {
	t.Parallel()
	cfg, err := LoadSweeper(env(map[string]string{
		"PROCESSOR_TIMEOUT": "1h", "HTTP_WRITE_TIMEOUT": "1s", "MAX_BODY_BYTES": "lots",
		"IDEMPOTENCY_KEY_RETENTION": "48h", "OUTBOX_EVENT_RETENTION": "240h",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KeyRetention != 48*time.Hour || cfg.EventRetention != 240*time.Hour || cfg.WebhookRetention != 30*24*time.Hour {
		t.Errorf("sweeper config %+v", cfg)
	}
	if _, err := LoadSweeper(env(map[string]string{"IDEMPOTENCY_KEY_RETENTION": "30m", "RECONCILER_MAX_AGE": "1h"})); err == nil {
		t.Error("a window shorter than RECONCILER_MAX_AGE was accepted")
	}
}

// No published secret or key works outside the demo: the processor's
// webhook secret must be set with PROCESSOR_URL, and may be the published
// test secret only in DEMO_MODE; the demo callers (published keys) are
// seeded by default only in DEMO_MODE.
func TestNoPublishedSecretOutsideTheDemo(t *testing.T) {
	t.Parallel()
	load := func(vars map[string]string) (Server, error) {
		return Load(func(k string) string { return vars[k] })
	}
	for _, tc := range []struct {
		vars map[string]string
		want string // "" when accepted
	}{
		{map[string]string{}, ""},
		{map[string]string{"PROCESSOR_URL": "http://processor:8081"}, "PROCESSOR_WEBHOOK_SECRET is not set"},
		{map[string]string{"PROCESSOR_URL": "http://processor:8081", "PROCESSOR_WEBHOOK_SECRET": DemoProcessorWebhookSecret}, "published test secret"},
		{map[string]string{"PROCESSOR_WEBHOOK_SECRET": DemoProcessorWebhookSecret}, "published test secret"},
		{map[string]string{"PROCESSOR_URL": "http://processor:8081", "PROCESSOR_WEBHOOK_SECRET": DemoProcessorWebhookSecret, "DEMO_MODE": "true"}, ""},
		{map[string]string{"PROCESSOR_URL": "http://processor:8081", "PROCESSOR_WEBHOOK_SECRET": "whsec_real"}, ""},
	} {
		_, err := load(tc.vars)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v; want accepted", tc.vars, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v; want an error saying %q", tc.vars, err, tc.want)
		}
	}
	for _, tc := range []struct {
		vars map[string]string
		seed bool
	}{
		{map[string]string{}, false},
		{map[string]string{"DEMO_MODE": "true"}, true},
		{map[string]string{"SEED_DEMO_CALLERS": "true"}, true},
		{map[string]string{"DEMO_MODE": "true", "SEED_DEMO_CALLERS": "false"}, false},
	} {
		cfg, err := load(tc.vars)
		if err != nil || cfg.SeedDemoCallers != tc.seed {
			t.Errorf("%v: SeedDemoCallers %v (%v); want %v", tc.vars, cfg.SeedDemoCallers, err, tc.seed)
		}
	}
}
