package idempotency

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/retrysafe/payments/internal/problem"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", MaxKeyLength)
	tests := []struct {
		name    string
		lines   []string
		want    string
		wantErr problem.Code
	}{
		{"sf-string", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", ""},
		{"bare token names the same key", []string{`8e03978e-40d5-43e8-bc93-6894a57f9324`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", ""},
		{"surrounding whitespace", []string{"  \"abc\"\t"}, "abc", ""},
		{"sf-string with escapes", []string{`"a\"b\\c"`}, `a"b\c`, ""},
		{"inner spaces", []string{`"order 42 for bob"`}, "order 42 for bob", ""},
		{"bare with inner spaces", []string{`order 42`}, "order 42", ""},
		{"one character", []string{"x"}, "x", ""},
		{"255 characters", []string{long}, long, ""},
		{"255 characters quoted", []string{`"` + long + `"`}, long, ""},
		{"missing", nil, "", problem.IdempotencyKeyMissing},
		{"repeated header lines", []string{"a", "a"}, "", problem.IdempotencyKeyInvalid},
		{"two keys folded into one line", []string{"x1, x2"}, "", problem.IdempotencyKeyInvalid},
		{"a bare comma", []string{"a,b"}, "", problem.IdempotencyKeyInvalid},
		{"a comma, quoted", []string{`"a,b"`}, "a,b", ""},
		{"empty", []string{""}, "", problem.IdempotencyKeyInvalid},
		{"only whitespace", []string{"   "}, "", problem.IdempotencyKeyInvalid},
		{"empty sf-string", []string{`""`}, "", problem.IdempotencyKeyInvalid},
		{"256 characters", []string{long + "k"}, "", problem.IdempotencyKeyInvalid},
		{"256 characters quoted", []string{`"` + long + `k"`}, "", problem.IdempotencyKeyInvalid},
		{"non-ASCII", []string{"clé"}, "", problem.IdempotencyKeyInvalid},
		{"non-ASCII quoted", []string{`"clé"`}, "", problem.IdempotencyKeyInvalid},
		{"control character", []string{"a\tb"}, "", problem.IdempotencyKeyInvalid},
		{"DEL", []string{"a\x7fb"}, "", problem.IdempotencyKeyInvalid},
		{"unterminated sf-string", []string{`"abc`}, "", problem.IdempotencyKeyInvalid},
		{"text after sf-string", []string{`"abc"def`}, "", problem.IdempotencyKeyInvalid},
		{"sf parameters", []string{`"abc";v=1`}, "", problem.IdempotencyKeyInvalid},
		{"bad escape", []string{`"a\nb"`}, "", problem.IdempotencyKeyInvalid},
		{"trailing backslash", []string{`"ab\`}, "", problem.IdempotencyKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.lines)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseKey(%q) = %q, %v; want %q", tt.lines, got, err, tt.want)
				}
				return
			}
			var p *problem.Error
			if !errors.As(err, &p) || p.Code != tt.wantErr || p.Status() != 400 {
				t.Fatalf("ParseKey(%q) = %q, %v; want a 400 %s problem", tt.lines, got, err, tt.wantErr)
			}
		})
	}
}

// FuzzParseKey checks the invariants of every accepted key, whatever the
// input: 1 to 255 printable ASCII characters, and its quoted form (with the
// two escapes) parses back to itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, "abc", `"a\"b"`, `""`, "", `"x`, "é", `"a\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := ParseKey([]string{v})
		if err != nil {
			var p *problem.Error
			if !errors.As(err, &p) || p.Status() != 400 {
				t.Fatalf("ParseKey(%q): error %v is not a 400 problem", v, err)
			}
			return
		}
		if len(key) < 1 || len(key) > MaxKeyLength {
			t.Fatalf("ParseKey(%q) = %q: length %d out of range", v, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte 0x%02x is not printable ASCII", v, key, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := ParseKey([]string{quoted}); err != nil || again != key {
			t.Fatalf("quoted form %q of key %q parsed as %q, %v", quoted, key, again, err)
		}
	})
}

func TestNewResponseKeepsOnlyAllowListedHeaders(t *testing.T) {
	t.Parallel()
	r := NewResponse(201, http.Header{
		"Content-Type":     {"application/json"},
		"Location":         {"/v1/orders/ord_1"},
		"Content-Encoding": {"gzip"},
		"Set-Cookie":       {"session=secret"},
		"Date":             {"Sun, 29 Nov 2026 20:00:00 GMT"},
		"X-Request-Id":     {"abc"},
	}, nil)
	if len(r.Header) != 3 || r.Header.Get("Set-Cookie") != "" || r.Header.Get("Date") != "" {
		t.Errorf("kept headers %v; want only Content-Type, Location and Content-Encoding", r.Header)
	}
	if r.Body == nil || len(r.Body) != 0 {
		t.Errorf("a nil body must be stored as an empty one, got %#v", r.Body)
	}
}
