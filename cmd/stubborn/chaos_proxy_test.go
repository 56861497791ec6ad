package main

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// faultProxy is a TCP proxy on 127.0.0.1 in front of one NATS node, for one
// Stubborn replica: the chaos suite (chaos_test.go) puts latency on the
// link, blackholes it (connections are accepted and kept, nothing is
// forwarded either way) or resets its connections.
type faultProxy struct {
	lis    net.Listener
	target string

	latency   atomic.Int64 // nanoseconds added before each chunk is forwarded
	blackhole atomic.Bool  // accept, read, forward nothing
	refuse    atomic.Bool  // reset new connections at once (during a reset storm)

	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// proxyConn is one client connection and its upstream.
type proxyConn struct {
	client, upstream net.Conn
	// dirty: bytes were dropped while blackholed, so the stream is
	// broken and the connection is reset once the blackhole ends.
	dirty atomic.Bool
	once  sync.Once
}

func (c *proxyConn) reset() {
	c.once.Do(func() {
		for _, n := range []net.Conn{c.client, c.upstream} {
			if tc, ok := n.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			_ = n.Close()
		}
	})
}

// startFaultProxy listens on 127.0.0.1 and forwards to target.
func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &faultProxy{lis: lis, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.lis.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		pc := &proxyConn{client: c, upstream: up}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pc.reset()
			return
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(pc, c, up)
		go p.pump(pc, up, c)
	}
}

// pump copies from src to dst chunk by chunk, applying the faults.
func (p *faultProxy) pump(pc *proxyConn, src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		pc.reset()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.blackhole.Load() {
				pc.dirty.Store(true)
			} else {
				if d := time.Duration(p.latency.Load()); d > 0 {
					time.Sleep(d)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// setLatency delays every chunk forwarded from now on by d (0: none).
func (p *faultProxy) setLatency(d time.Duration) { p.latency.Store(int64(d)) }

// setBlackhole starts or ends a blackhole. At its end the connections
// that lost bytes are reset (their streams are broken): the client has to
// reconnect, as after a real partition.
func (p *faultProxy) setBlackhole(on bool) {
	p.blackhole.Store(on)
	if on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		if pc.dirty.Load() {
			pc.reset()
		}
	}
}

// resetAll resets every open connection (RST both ways).
func (p *faultProxy) resetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.reset()
	}
}

// active is how many client connections the proxy holds open.
func (p *faultProxy) active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *faultProxy) close() {
	p.mu.Lock()
	p.closed = true
	for pc := range p.conns {
		pc.reset()
	}
	p.mu.Unlock()
	_ = p.lis.Close()
	p.wg.Wait()
}
