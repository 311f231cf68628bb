package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
	t.Cleanup(srv.Close)
	if err := check(srv.URL); err != nil {
		t.Errorf("200: %v", err)
	}
	status = http.StatusServiceUnavailable
	if err := check(srv.URL); err == nil {
		t.Error("503 passed the health check")
	}
	if err := check("http://127.0.0.1:1/"); err == nil {
		t.Error("a refused connection passed the health check")
	}
}
