package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The configuration table of docs/operations.md states every variable's
// default; the code's must be the same, so that changing a default without
// its doc fails here. A default is checked by loading the configuration
// twice, with the variable unset and set to the documented value: the two
// must be equal, whatever field the variable fills.
func TestDocumentedDefaultsAreTheCodes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	defaults := documentedDefaults(t, string(doc))
	if len(defaults) < 30 {
		t.Fatalf("read %d documented defaults; the table has more: has its layout changed?", len(defaults))
	}
	for name, value := range defaults {
		if msg := differs(name, value); msg != "" {
			t.Errorf("docs/operations.md says %s defaults to %q, but %s", name, value, msg)
		}
	}
	// Every variable the programs read is in the table.
	for _, load := range []func(func(string) string) error{
		func(g func(string) string) error { _, err := Load(g); return err },
		func(g func(string) string) error { _, err := LoadSweeper(g); return err },
	} {
		_ = load(func(name string) string {
			if !strings.Contains(string(doc), "`"+name+"`") {
				t.Errorf("%s is read but not in docs/operations.md's table", name)
			}
			return ""
		})
	}
	// And the check can fail: a lease documented as 11s is not the code's.
	if differs("IDEMPOTENCY_LEASE", "11s") == "" {
		t.Error("a wrong documented lease went unnoticed")
	}
}

// differs says how setting name to value changes what the server's or the
// sweeper's configuration loads ("" when it changes nothing: value is the
// default).
func differs(name, value string) string {
	unset := func(string) string { return "" }
	set := func(n string) string {
		if n == name {
			return value
		}
		return ""
	}
	s0, _ := Load(unset)
	s1, err := Load(set)
	if err != nil {
		return "the server refuses it: " + err.Error()
	}
	if !reflect.DeepEqual(s0, s1) {
		return "the server's default is another"
	}
	w0, _ := LoadSweeper(unset)
	w1, err := LoadSweeper(set)
	if err != nil {
		return "the sweeper refuses it: " + err.Error()
	}
	if !reflect.DeepEqual(w0, w1) {
		return "the sweeper's default is another"
	}
	return ""
}

// documentedDefaults reads the table's rows: the variables of a row, in
// backquotes, and the defaults in backquotes before any parenthesis, one
// for each; "(empty)" is the empty string. A row without a default for
// each of its variables (a random secret, the SDK's own variables) is left
// out.
func documentedDefaults(t *testing.T, doc string) map[string]string {
	t.Helper()
	quoted := regexp.MustCompile("`([^`]*)`")
	out := map[string]string{}
	for line := range strings.SplitSeq(doc, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		var names []string
		for _, m := range quoted.FindAllStringSubmatch(cells[1], -1) {
			if strings.ToUpper(m[1]) != m[1] || strings.Contains(m[1], "*") {
				names = nil
				break
			}
			names = append(names, m[1])
		}
		def := strings.TrimSpace(cells[2])
		var values []string
		if def == "(empty)" {
			values = []string{""}
		} else {
			before, _, _ := strings.Cut(def, "(")
			for _, m := range quoted.FindAllStringSubmatch(before, -1) {
				values = append(values, m[1])
			}
		}
		if len(names) == 0 || len(names) != len(values) {
			continue
		}
		for i, n := range names {
			out[n] = values[i]
		}
	}
	return out
}
