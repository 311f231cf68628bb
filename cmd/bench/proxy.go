package main

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// In the counted phase, every client of the bench database (the servers,
// and pgx for the SQL phases) reaches PostgreSQL through a counter of round
// trips; with -db-latency, every phase goes through toxiproxy too: the
// database a network hop away, as in a real deployment, where each round
// trip costs what no CPU profile of one machine shows. A pipeline
// (statements written together, answered in order) is one round trip.

// trips counts the round trips, all connections together.
var trips atomic.Int64

// startProxies starts the proxies in front of upstream (host:port) and
// returns the addresses to dial, through the counter and without it.
// Toxiproxy delays in whole milliseconds, so the round trip's delay (twice
// latency) is put on the answers alone.
func startProxies(upstream string, latency time.Duration) (counted, direct string, err error) {
	if latency > 0 {
		if (2*latency)%time.Millisecond != 0 {
			return "", "", fmt.Errorf("-db-latency %s: twice it must be whole milliseconds (toxiproxy's unit)", latency)
		}
		srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
		proxy := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", upstream)
		if err := proxy.Start(); err != nil {
			return "", "", err
		}
		toxic := fmt.Sprintf(`{"type":"latency","stream":"downstream","attributes":{"latency":%d}}`, 2*latency/time.Millisecond)
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			return "", "", err
		}
		upstream = proxy.Listen
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go count(client, upstream)
		}
	}()
	return ln.Addr().String(), upstream, nil
}

// count relays one connection, counting a round trip each time the client
// sends after an answer (or for the first time).
func count(client net.Conn, upstream string) {
	defer client.Close()
	db, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer db.Close()
	var answered atomic.Bool
	answered.Store(true)
	go func() {
		relay(client, db, func() { answered.Store(true) })
		client.Close()
	}()
	relay(db, client, func() {
		if answered.Swap(false) {
			trips.Add(1)
		}
	})
}

// relay copies from src to dst, calling read before it forwards each read.
func relay(dst io.Writer, src io.Reader, read func()) {
	_, _ = io.Copy(dst, tap{src, read})
}

type tap struct {
	io.Reader
	read func()
}

func (t tap) Read(p []byte) (int, error) {
	n, err := t.Reader.Read(p)
	if n > 0 {
		t.read()
	}
	return n, err
}
