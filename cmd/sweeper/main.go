// Command sweeper will delete idempotency keys (and other retained records)
// past their retention window. It is a placeholder until the retention
// issue builds it; see DESIGN.md, "Retention and the sweeper".
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "sweeper: not implemented yet (see the retention and sweeper issue)")
	os.Exit(2)
}
