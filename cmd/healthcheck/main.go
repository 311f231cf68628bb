// Command healthcheck asks a URL and exits 0 if it answers 200, 1
// otherwise: the container image's HEALTHCHECK, which has no shell or curl
// to do it (the final image is distroless).
//
//	healthcheck http://127.0.0.1:8080/healthz
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: healthcheck URL")
		os.Exit(2)
	}
	if err := check(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

func check(url string) error {
	client := &http.Client{Timeout: 3 * time.Second}
	res, err := client.Get(url) // #nosec G704 -- the URL is the container's own health endpoint, from its command line
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, res.Status)
	}
	return nil
}
