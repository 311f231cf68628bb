package main

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// slots is a listener that caps the open connections, closing the one idle
// longest to make room (its client reconnects, as after a keep-alive
// timeout); no one address holds more than its share. A newcomer waits, in
// the kernel's queue, only while every connection serves a request.
type slots struct {
	net.Listener
	max, perAddress int
	mu              sync.Mutex
	freed           *sync.Cond // a slot closed or went idle, or the listener closed
	open            map[net.Conn]*slot
	closed          bool
}

type slot struct {
	address   string    // the client's IP, or its IPv6 /64
	idleSince time.Time // zero while it serves a request
}

func newSlots(ln net.Listener, max, perAddress int) *slots {
	s := &slots{Listener: ln, max: max, perAddress: perAddress, open: map[net.Conn]*slot{}}
	s.freed = sync.NewCond(&s.mu)
	return s
}

// Accept makes room for each connection, or refuses it (admit).
func (s *slots) Accept() (net.Conn, error) {
	for {
		c, err := s.Listener.Accept()
		if err != nil || s.admit(c) {
			return c, err
		}
		_ = c.Close() // its address holds its share, all of it busy
	}
}

func (s *slots) admit(c net.Conn) bool {
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	ip := ap.Addr().Unmap()
	address := ip.String()
	if ip.Is6() {
		address = netip.PrefixFrom(ip, 64).Masked().String() // one host often has a whole /64
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		mine := 0
		for _, sl := range s.open {
			if sl.address == address {
				mine++
			}
		}
		if mine < s.perAddress && len(s.open) < s.max {
			s.open[c] = &slot{address, time.Now()} // idle until its first request
			return true
		}
		// Over its share, c's address makes room among its own.
		var oldest net.Conn
		for o, sl := range s.open {
			if !sl.idleSince.IsZero() && (mine < s.perAddress || sl.address == address) &&
				(oldest == nil || sl.idleSince.Before(s.open[oldest].idleSince)) {
				oldest = o
			}
		}
		switch {
		case s.closed: // Shutdown waits for Serve to return, not for room
			return false
		case oldest != nil:
			delete(s.open, oldest)
			_ = oldest.Close()
		case mine >= s.perAddress && len(s.open) < s.max:
			return false // the room left is for other addresses
		default:
			s.freed.Wait()
		}
	}
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
		s.freed.Signal() // room, for an Accept that waits
	case state == http.StateClosed || state == http.StateHijacked:
		delete(s.open, c)
		s.freed.Signal()
	}
}

// Close closes the listener, and wakes an Accept that waits for room.
func (s *slots) Close() error {
	s.mu.Lock()
	s.closed = true
	s.freed.Broadcast()
	s.mu.Unlock()
	return s.Listener.Close()
}
