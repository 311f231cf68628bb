package config

import "fmt"

// Problems collects what is wrong with a background worker's
// configuration, so that its constructor reports every mistake at once
// and a bad configuration fails at start-up, never as a loop that
// misbehaves later (River's maintenance services do the same).
type Problems []string

// Check notes the problem when ok is false.
func (p *Problems) Check(ok bool, format string, args ...any) {
	if !ok {
		*p = append(*p, fmt.Sprintf(format, args...))
	}
}

// Err is nil when nothing was noted.
func (p Problems) Err(worker string) error {
	if len(p) == 0 {
		return nil
	}
	return fmt.Errorf("%s: invalid configuration: %v", worker, []string(p))
}
