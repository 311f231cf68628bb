package main

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// slots caps the open connections without letting anyone hoard them. At
// the cap, the connection idle longest is closed to make room (its client
// reconnects, as after a keep-alive timeout), and no one address holds more
// than its share. A newcomer waits, in the kernel's queue, only while every
// connection is serving a request.
type slots struct {
	max, perAddress int
	mu              sync.Mutex
	freed           *sync.Cond
	open            map[net.Conn]*slot
}

type slot struct {
	address   string    // the client's IP (its /64 for IPv6)
	idleSince time.Time // zero while it serves a request
}

func newSlots(max, perAddress int) *slots {
	s := &slots{max: max, perAddress: perAddress, open: map[net.Conn]*slot{}}
	s.freed = sync.NewCond(&s.mu)
	return s
}

// listener is ln, making room for each connection it accepts.
func (s *slots) listener(ln net.Listener) net.Listener { return slotListener{ln, s} }

type slotListener struct {
	net.Listener
	slots *slots
}

func (l slotListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.slots.admit(c) {
			return c, err
		}
		c.Close() // its address holds its share, all of it busy
	}
}

// admit makes room for c by closing the connection idle longest (of c's
// address, when that holds its share), or waits while all are busy. It
// refuses c when c's address holds its share and all of it is busy.
func (s *slots) admit(c net.Conn) bool {
	address := addressOf(c.RemoteAddr())
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		mine := 0
		var oldest, oldestMine net.Conn
		for o, sl := range s.open {
			same := sl.address == address
			if same {
				mine++
			}
			if sl.idleSince.IsZero() {
				continue
			}
			if oldest == nil || sl.idleSince.Before(s.open[oldest].idleSince) {
				oldest = o
			}
			if same && (oldestMine == nil || sl.idleSince.Before(s.open[oldestMine].idleSince)) {
				oldestMine = o
			}
		}
		switch {
		case mine >= s.perAddress && oldestMine == nil:
			return false
		case mine >= s.perAddress:
			s.closeIdle(oldestMine)
		case len(s.open) >= s.max && oldest != nil:
			s.closeIdle(oldest)
		case len(s.open) >= s.max:
			s.freed.Wait()
		default:
			s.open[c] = &slot{address: address, idleSince: time.Now()} // idle until its first request
			return true
		}
	}
}

func (s *slots) closeIdle(c net.Conn) {
	delete(s.open, c)
	c.Close()
}

// track is the http.Server's ConnState hook.
func (s *slots) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.open[c]
	switch {
	case sl == nil: // closed to make room
	case state == http.StateActive:
		sl.idleSince = time.Time{}
	case state == http.StateIdle:
		sl.idleSince = time.Now()
	case state == http.StateClosed || state == http.StateHijacked:
		delete(s.open, c)
		s.freed.Signal()
	}
}

// addressOf is a client's address for its share: its IP, or its /64 for
// IPv6, which a single host usually has whole.
func addressOf(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := ap.Addr().Unmap(); ip.Is4() {
		return ip.String()
	}
	p, _ := ap.Addr().Prefix(64)
	return p.String()
}
