package main

import (
	"os"
	"path/filepath"
	"testing"
)

// procIO counts this process's own write calls: three writes to a file
// are three more (a little more is the runtime's own, never fewer).
func TestProcIOCountsWrites(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, err := procIO(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	after, err := procIO(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if n := after.writes - before.writes; n < 3 {
		t.Errorf("%d write calls counted for 3 writes", n)
	}
	if after.reads <= before.reads { // reading /proc/<pid>/io is a read itself
		t.Errorf("reads %d, then %d: reading the counters counted no read", before.reads, after.reads)
	}
}
