package config

import "fmt"

// Problems collects a background worker's configuration mistakes, so its
// constructor reports them all at once and a bad one fails at start-up,
// never as a loop that misbehaves later (as River's services do).
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
