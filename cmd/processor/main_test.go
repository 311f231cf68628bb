package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/payments/internal/fakeprocessor"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestRunRejectsInvalidConfiguration(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), nil, env(map[string]string{
		"CHAOS_ERROR_RATE": "2",
		"WEBHOOK_URL":      "nowhere",
	}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "CHAOS_ERROR_RATE") {
		t.Fatalf("err = %v; want CHAOS_ERROR_RATE named", err)
	}
	if err := run(context.Background(), nil, env(map[string]string{"WEBHOOK_URL": "nowhere"}), io.Discard); err == nil {
		t.Error("run accepted a webhook URL that is not one")
	}
	if err := run(context.Background(), []string{"serve"}, env(nil), io.Discard); err == nil {
		t.Error("run accepted arguments")
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	ctx, stop := context.WithCancel(context.Background())
	logs, logWriter := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, env(map[string]string{"PROCESSOR_ADDR": "127.0.0.1:0"}), logWriter)
		logWriter.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not listening after 30s")
	}

	req, _ := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(`{"amount":100,"currency":"usd","payment_method":"pm_card_visa"}`))
	req.Header.Set("Idempotency-Key", "from-main")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("charge: %d", res.StatusCode)
	}
	res, err = http.Get(base + "/v1/ledger?idempotency_key=from-main")
	if err != nil {
		t.Fatal(err)
	}
	var ledger fakeprocessor.LedgerList
	err = json.NewDecoder(res.Body).Decode(&ledger)
	res.Body.Close()
	if err != nil || len(ledger.Data) != 1 {
		t.Fatalf("ledger: %+v, %v", ledger, err)
	}

	// A withheld answer must not hold up the graceful shutdown: Close
	// releases it when shutdown begins.
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(`{"amount":100,"currency":"usd","payment_method":"pm_card_timeout"}`))
		req.Header.Set("Idempotency-Key", "held")
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		held <- err
	}()
	for {
		res, err := http.Get(base + "/v1/ledger?idempotency_key=held")
		if err != nil {
			t.Fatal(err)
		}
		var l fakeprocessor.LedgerList
		json.NewDecoder(res.Body).Decode(&l)
		res.Body.Close()
		if len(l.Data) == 1 {
			break // the charge is made and its answer is being withheld
		}
	}

	stop() // what SIGINT/SIGTERM do in main
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("graceful shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after its context was canceled")
	}
	if err := <-held; err != nil {
		t.Errorf("the withheld request: %v; want its (late) answer", err)
	}
}
