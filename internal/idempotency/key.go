package idempotency

import (
	"fmt"
	"strings"

	"github.com/retrysafe/payments/internal/problem"
)

// MaxKeyLength is the longest key accepted, in characters (unquoted).
const MaxKeyLength = 255

// ParseKey reads the Idempotency-Key header from all of its field lines.
//
// The IETF draft defines the value as a Structured Field string ("8e03...");
// Stripe's clients send it bare, which names the same key (CheckKey).
//
// A header on several lines is rejected, not joined or truncated: two keys
// is a client bug, and guessing which was meant could replay the wrong
// operation. So is a bare value with a comma, as HTTP folds two field
// lines into one ("x1, x2"); a key that holds a comma can be sent quoted.
func ParseKey(lines []string) (string, error) {
	switch {
	case len(lines) == 0:
		return "", problem.New(problem.IdempotencyKeyMissing,
			"this operation requires an Idempotency-Key header; generate one unique value (a UUID) per logical operation and send the same value on every retry of it")
	case len(lines) > 1:
		return "", problem.New(problem.IdempotencyKeyInvalid,
			"the Idempotency-Key header was sent %d times; send it exactly once", len(lines))
	}
	// As HTTP does, for values that reach us through other paths.
	key := strings.Trim(lines[0], " \t")
	if strings.HasPrefix(key, `"`) {
		var err error
		if key, err = parseSFString(key); err != nil {
			return "", err
		}
	} else if strings.Contains(key, ",") {
		return "", problem.New(problem.IdempotencyKeyInvalid,
			"the Idempotency-Key has a comma, as two keys folded into one field line do; send one key, quoted if it holds a comma")
	}
	if err := CheckKey(key); err != nil {
		return "", problem.New(problem.IdempotencyKeyInvalid, "the Idempotency-Key %v", err)
	}
	return key, nil
}

// CheckKey reports whether key (already unquoted) is 1 to 255 printable
// ASCII characters. The error completes the sentence "the key ...".
func CheckKey(key string) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("is empty; it must be 1 to %d characters", MaxKeyLength)
	case len(key) > MaxKeyLength:
		return fmt.Errorf("is %d characters long; it must be at most %d", len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("contains a character outside printable ASCII (byte 0x%02x at position %d)", c, i)
		}
	}
	return nil
}

// parseSFString parses an RFC 8941 sf-string: DQUOTE *(unescaped / "\" (
// DQUOTE / "\" )) DQUOTE. Parameters after it are not part of this
// header's definition, and are rejected.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", problem.New(problem.IdempotencyKeyInvalid,
					`the quoted Idempotency-Key has a backslash that does not escape '"' or '\'`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", problem.New(problem.IdempotencyKeyInvalid,
					"the quoted Idempotency-Key has characters after its closing quote")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", problem.New(problem.IdempotencyKeyInvalid,
				"the Idempotency-Key contains a character outside printable ASCII (byte 0x%02x)", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", problem.New(problem.IdempotencyKeyInvalid, "the quoted Idempotency-Key has no closing quote")
}
