package natsstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/internal/neterr"
)

// errConnLost cancels the calls in flight when the connection to NATS is
// lost: nats.go would let a request whose connection dropped wait for
// its reply until the caller's deadline, and buffer new ones while it
// reconnects. The store fails them at once instead, an outage or not as
// connWatch.down finds.
var errConnLost = errors.New("natsstore: connection to NATS lost")

// connWatch follows the state of the connection. up is a context that
// is cancelled (with errConnLost) as soon as the connection it was made
// for is lost, and replaced by a new one once a connection is up again;
// every call runs under a context that ends with it.
//
// A connection is told from the next by nats.go's count of reconnects:
// up belongs to the connection of count gen. The watcher syncs on every
// status event, and every call syncs before its I/O: a disconnection
// (even one nats.go already recovered from, its events still queued)
// cancels up, and an event that arrives late cancels nothing made after
// it.
//
// While no connection is up, the watcher also keeps the last refusal of
// the client the connection met (nats.go's LastError after a reconnect
// the server refused: its credentials, its TLS), until a connection is up
// again. nats.go reports each failed attempt with a status event
// (RECONNECTING), its error already in LastError; a dial that failed it
// reports to nobody but the application's ReconnectErrHandler, and a
// server that closes the session (as one does when a config reload
// removed the user) is an EOF, as one that stops is. So a call made
// while no connection is up (or cut short by the loss) is no known outage
// by itself: down asks the servers of the connection's pool (see probe).
type connWatch struct {
	nc *nats.Conn
	ch chan nats.Status

	mu      sync.Mutex
	up      context.Context
	cancel  context.CancelCauseFunc
	gen     uint64
	refused error // the last refusal since a connection was last up

	violations *violationWatch // the store's, set before any call

	probing *probe // the probe in flight, shared by the calls that need it
	probeWG sync.WaitGroup
	stopped bool
	bg      context.Context // ends the probes at stop
	stopBG  context.CancelFunc

	done chan struct{}
}

func newConnWatch(nc *nats.Conn) *connWatch {
	w := &connWatch{nc: nc, done: make(chan struct{})}
	w.bg, w.stopBG = context.WithCancel(context.Background())
	w.up, w.cancel = context.WithCancelCause(context.Background())
	w.cancel(errConnLost) // sync makes the first one
	w.ch = nc.StatusChanged()
	w.sync()
	go w.run()
	return w
}

func (w *connWatch) run() {
	defer close(w.done)
	for range w.ch {
		w.sync()
	}
}

// state returns the connection's status and its count of reconnects, read
// together.
func (w *connWatch) state() (nats.Status, uint64) {
	for {
		gen := w.nc.Stats().Reconnects
		st := w.nc.Status()
		if w.nc.Stats().Reconnects == gen {
			return st, gen
		}
	}
}

// sync brings up in line with the connection and returns it: cancelled
// when the connection it was made for is gone (or none is up), new when
// a connection is up and the last one was cancelled.
func (w *connWatch) sync() context.Context {
	st, gen := w.state()
	var last error
	if st != nats.CONNECTED {
		last = w.nc.LastError()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up.Err() == nil && (st != nats.CONNECTED || gen != w.gen) {
		w.cancel(errConnLost)
	}
	if w.up.Err() != nil && st == nats.CONNECTED {
		w.up, w.cancel = context.WithCancelCause(context.Background())
		w.gen = gen
	}
	switch {
	case st == nats.CONNECTED:
		w.refused = nil
	case refusal(last):
		w.refused = last
	}
	return w.up
}

// current returns the up context, or, when no connection is up, the
// error of a call that cannot be made (see down).
func (w *connWatch) current(ctx context.Context) (context.Context, error) {
	up := w.sync()
	if up.Err() != nil {
		return nil, w.down(ctx, nil)
	}
	return up, nil
}

// down is the error of a call made while no connection is up, or cut
// short by its loss (cause, nil for none): an outage (stores.ErrUnavailable)
// when no server of the pool can be reached (see probe), whatever the
// server said before; else ErrRefused while the server refuses the
// connection's reconnects, ErrNotConnected until one says why. ctx ended
// first: its error.
func (w *connWatch) down(ctx context.Context, cause error) error {
	st := w.nc.Status()
	what := fmt.Sprintf("the NATS connection is %s", st)
	if cause != nil {
		what = fmt.Sprintf("%v (the NATS connection is %s)", cause, st)
	}
	unreachable, err := w.reach(ctx)
	if err != nil {
		if cause != nil {
			return fmt.Errorf("%w (%v)", err, cause)
		}
		return err
	}
	if unreachable != nil {
		return fmt.Errorf("%w: %s, and no server of its pool can be reached: %w", stores.ErrUnavailable, what, unreachable)
	}
	if last := w.nc.LastError(); errors.Is(last, nats.ErrMaxConnectionsExceeded) && w.nc.Status() != nats.CONNECTED {
		// The server's word at the last reconnect: it cannot take
		// another connection now.
		return fmt.Errorf("%w: %s: %w", stores.ErrUnavailable, what, last)
	}
	w.sync()
	w.mu.Lock()
	refused := w.refused
	w.mu.Unlock()
	if refused != nil {
		return fmt.Errorf("%w: %s: the server refused it: %w", ErrRefused, what, refused)
	}
	return fmt.Errorf("%w: %s, and a server of its pool answers a new connection: not known to be an outage", ErrNotConnected, what)
}

// probe is a check of the servers of the connection's pool, shared by
// the calls made while it runs.
type probe struct {
	done        chan struct{}
	unreachable error // set when no server can be reached, the reason
}

// reach reports, by a probe (its own, or one in flight), whether a server
// of the connection's pool can be reached: unreachable is nil when one
// answers a new connection (or the probe could not tell), else why none
// does, a known outage. err is ctx's error when it ended first.
func (w *connWatch) reach(ctx context.Context) (unreachable, err error) {
	w.mu.Lock()
	p := w.probing
	if p == nil && !w.stopped {
		p = &probe{done: make(chan struct{})}
		w.probing = p
		w.probeWG.Add(1)
		go w.run1(p)
	}
	w.mu.Unlock()
	if p == nil {
		return nil, nil // stopped: the store is closed
	}
	select {
	case <-p.done:
		return p.unreachable, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run1 runs probe p to its end, then lets the next call start another.
func (w *connWatch) run1(p *probe) {
	defer w.probeWG.Done()
	p.unreachable = w.probeServers()
	w.mu.Lock()
	w.probing = nil
	w.mu.Unlock()
	close(p.done)
}

// probeTimeout bounds a probe of one server when the connection has no
// connect timeout.
const probeTimeout = 2 * time.Second

// probeServers dials every server of the connection's pool at once, as
// nats.go's reconnects do (its dialer, its timeout), and reads the first
// bytes the server sends (its INFO): nil as soon as one answers, or
// when one fails in a way that is no known outage (accepted, then closed:
// a server turning the client away looks so); else, when every one is
// known to be down (nothing listens, the dial or the server's first word
// timed out, the host or network cannot be reached), the reasons.
func (w *connWatch) probeServers() error {
	timeout := w.nc.Opts.Timeout
	if timeout <= 0 {
		timeout = probeTimeout
	}
	ctx, cancel := context.WithTimeout(w.bg, timeout)
	defer cancel()
	if ip := w.nc.Opts.InProcessServer; ip != nil {
		c, err := ip.InProcessConn()
		if err != nil {
			return fmt.Errorf("the in-process server: %w", err)
		}
		_ = c.Close()
		return nil
	}
	servers := w.nc.Servers()
	if len(servers) == 0 {
		// A connection closed after its reconnects ran out has emptied
		// its pool: the servers it was given.
		servers = w.nc.Opts.Servers
		if len(servers) == 0 && w.nc.Opts.Url != "" {
			servers = strings.Split(w.nc.Opts.Url, ",")
		}
	}
	if len(servers) == 0 {
		return nil
	}
	results := make(chan error, len(servers))
	for _, srv := range servers {
		go func() { results <- w.probeServer(ctx, srv) }()
	}
	var down []error
	for range servers {
		err := <-results
		if err == nil || !errors.Is(err, errServerDown) {
			return nil // one answers, or cannot be told down
		}
		down = append(down, err)
	}
	return errors.Join(down...)
}

// errServerDown marks the probe of a server known to be down.
var errServerDown = errors.New("down")

// probeServer dials the server of URL srv and reads its first bytes.
func (w *connWatch) probeServer(ctx context.Context, srv string) error {
	u, err := url.Parse(srv)
	if err != nil {
		return err
	}
	host := u.Host
	if u.Port() == "" {
		port := "4222"
		switch strings.ToLower(u.Scheme) {
		case "ws":
			port = "80"
		case "wss":
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	c, err := w.dial(ctx, host)
	if err != nil {
		if neterr.DialOutage(err) {
			return fmt.Errorf("%s: %w: %w", host, errServerDown, err)
		}
		return err
	}
	defer c.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	// The server's first word: its INFO; under TLS first (wss, or the
	// connection's TLSHandshakeFirst) its side of a handshake; over a
	// websocket, its answer to an HTTP request.
	scheme := strings.ToLower(u.Scheme)
	if scheme == "wss" || w.nc.Opts.TLSHandshakeFirst {
		// Only whether the server speaks: nothing is sent after the
		// handshake, and a certificate it has is not checked here.
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, ServerName: u.Hostname()}) //nolint:gosec // a probe
		err = tc.HandshakeContext(ctx)
	} else {
		if scheme == "ws" {
			_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n"))
		}
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
	}
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		// Accepted (by the kernel), but the server does not speak:
		// hung, stopped, overloaded.
		return fmt.Errorf("%s: %w: the server accepted the connection and said nothing: %w", host, errServerDown, err)
	}
	return nil // it answered (whatever it said)
}

// dial opens a TCP connection to host as nats.go would: with the
// connection's custom dialer, or its net.Dialer.
func (w *connWatch) dial(ctx context.Context, host string) (net.Conn, error) {
	if cd := w.nc.Opts.CustomDialer; cd != nil {
		if dc, ok := cd.(interface {
			DialContext(ctx context.Context, network, address string) (net.Conn, error)
		}); ok {
			return dc.DialContext(ctx, "tcp", host)
		}
		type dialed struct {
			c   net.Conn
			err error
		}
		ch := make(chan dialed, 1)
		go func() {
			c, err := cd.Dial("tcp", host)
			ch <- dialed{c, err}
		}()
		select {
		case d := <-ch:
			return d.c, d.err
		case <-ctx.Done():
			go func() {
				if d := <-ch; d.c != nil {
					_ = d.c.Close()
				}
			}()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
		}
	}
	var d net.Dialer
	if w.nc.Opts.Dialer != nil {
		d = *w.nc.Opts.Dialer
	}
	d.Timeout = 0 // ctx bounds it
	return d.DialContext(ctx, "tcp", host)
}

// stop ends the watcher and waits for it, and for a probe in flight
// (stopped at once).
func (w *connWatch) stop() {
	w.nc.RemoveStatusListener(w.ch)
	<-w.done
	w.mu.Lock()
	w.cancel(errConnLost)
	w.stopped = true
	w.mu.Unlock()
	w.stopBG()
	w.probeWG.Wait()
}

// callContext is the context of one call's I/O (see callCtx), with the
// count of the connection's permissions violations when it began (see
// Store.denied).
type callContext struct {
	context.Context
	violations uint64
}

// callCtx returns the context one call's I/O runs under: ctx, also
// cancelled when the connection is lost. release must be called when
// the call is over.
func (w *connWatch) callCtx(ctx context.Context) (cctx context.Context, release func(), err error) {
	up, err := w.current(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(up, func() { cancel(errConnLost) })
	cc := &callContext{Context: c}
	if w.violations != nil {
		cc.violations = w.violations.now()
	}
	return cc, func() { stop(); cancel(nil) }, nil
}
