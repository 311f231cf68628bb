package cardprocessor_test

import (
	"regexp"
	"testing"

	"github.com/retrysafe/payments/internal/cardprocessor"
)

// A downstream key is "<caller>-" and 26 base32 characters, the same for
// the same (caller, key, fingerprint, generation) and different when any
// of them differs, fields running together included; the caller is found
// again from it whatever the caller's id contains.
func TestDownstreamKeyIsDerivedFromTheRequest(t *testing.T) {
	fp := []byte{1, 2, 3}
	key := cardprocessor.DownstreamKey("acme", "pay-1", fp, 0)
	if !regexp.MustCompile(`^acme-[a-z2-7]{26}$`).MatchString(key) {
		t.Fatalf("key %q; want acme- and 26 base32 characters", key)
	}
	if again := cardprocessor.DownstreamKey("acme", "pay-1", []byte{1, 2, 3}, 0); again != key {
		t.Errorf("the same request gave %q, then %q", key, again)
	}
	others := map[string]string{
		"another caller":                   cardprocessor.DownstreamKey("globex", "pay-1", fp, 0),
		"another key":                      cardprocessor.DownstreamKey("acme", "pay-2", fp, 0),
		"another fingerprint":              cardprocessor.DownstreamKey("acme", "pay-1", []byte{1, 2, 4}, 0),
		"another generation":               cardprocessor.DownstreamKey("acme", "pay-1", fp, 1),
		"key and fingerprint run together": cardprocessor.DownstreamKey("acme", "pay-1\x01", []byte{2, 3}, 0),
	}
	for what, other := range others {
		if other[len("acme-"):] == key[len("acme-"):] {
			t.Errorf("%s gave the same key %q", what, other)
		}
	}
	for _, caller := range []string{"acme", "north-wind", "a-b-c"} {
		got, ok := cardprocessor.CallerOfDownstreamKey(cardprocessor.DownstreamKey(caller, "k", fp, 0))
		if !ok || got != caller {
			t.Errorf("CallerOf(a key of %q) = %q, %v", caller, got, ok)
		}
	}
}
