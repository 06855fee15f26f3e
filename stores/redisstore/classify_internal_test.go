package redisstore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/dedup/internal/testkit/base"
	"github.com/watermill-dedup/dedup/stores"
)

// replyError is a Redis error reply, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

// TestClassifyServerReplies: the error replies of a server that cannot
// serve now are outages; the others are not.
func TestClassifyServerReplies(t *testing.T) {
	classify := (&Store{}).classify
	outages := []string{
		"LOADING Redis is loading the dataset in memory",
		"READONLY You can't write against a read only replica.",
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
		"CLUSTERDOWN The cluster is down",
		"TRYAGAIN Multiple keys request during rehashing of slot",
		"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
		"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
		"ERR max number of clients reached",
		"NOREPLICAS Not enough good replicas to write.",
	}
	for _, msg := range outages {
		if err := classify(fmt.Errorf("evalsha: %w", replyError(msg))); !errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("classify(%q) = %v, want an outage", msg, err)
		}
	}
	for _, msg := range []string{
		"ERR Error running script (call to f_x): @user_script:1: user_script:1: Script attempted to access a non local key in a cluster node",
		"WRONGTYPE Operation against a key holding the wrong kind of value",
		"NOSCRIPT No matching script. Please use EVAL.",
		"CROSSSLOT Keys in request don't hash to the same slot",
		"OOM command not allowed when used memory > 'maxmemory'.",
		"NOAUTH Authentication required.",
		"NOPERM this user has no permissions to run the 'evalsha' command",
	} {
		if err := classify(replyError(msg)); errors.Is(err, stores.ErrUnavailable) {
			t.Errorf("classify(%q) = %v, want no outage", msg, err)
		}
	}
	if err := classify(redis.ErrClosed); errors.Is(err, stores.ErrUnavailable) {
		t.Errorf("a client closed by its owner is not an outage: %v", err)
	}
}

func TestMSRoundsUpWithoutOverflow(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2},
		{time.Hour, 3_600_000}, {math.MaxInt64, 9_223_372_036_855}, {math.MaxInt64 - 1, 9_223_372_036_855},
	} {
		if got := ms(c.d); got != c.want {
			t.Errorf("ms(%d) = %d, want %d", c.d, got, c.want)
		}
	}
}

// TestClassifyConnectionErrors: an error is an outage only when it is
// known to be one, each error on its own, whatever the store heard
// before. A dial refused or timed out, a timeout, an unreachable network
// are; a TLS handshake that failed either way, and the server's refusal
// of the client's credentials or permissions, are refusals (ErrRefused);
// a name that does not resolve, the client closed by its owner, the
// caller's context are neither. A reset or an EOF is confirmed by a new
// connection to the server: an outage when nothing listens there, a
// refusal when the server refuses the new one too, and no known outage
// when the server answers it, or takes it and closes it without a reply.
func TestClassifyConnectionErrors(t *testing.T) {
	op := func(o string, err error) error {
		return &net.OpError{Op: o, Net: "tcp", Err: err}
	}
	outages := []error{
		op("dial", os.NewSyscallError("connect", syscall.ECONNREFUSED)),
		op("dial", os.NewSyscallError("connect", syscall.EHOSTUNREACH)),
		op("dial", &net.DNSError{Err: "i/o timeout", Name: "redis", IsTimeout: true}),
		op("dial", context.DeadlineExceeded), // net's dial timeout is context.DeadlineExceeded too
		op("read", os.ErrDeadlineExceeded),
		op("write", os.NewSyscallError("write", syscall.ENETUNREACH)),
		redis.ErrPoolTimeout,
	}
	refusals := []error{
		op("remote error", errors.New("tls: certificate required")),
		op("local error", errors.New("tls: bad record MAC")),
		tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"},
		&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}},
		replyError("WRONGPASS invalid username-password pair or user is disabled."),
		replyError("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"),
		replyError("NOPERM User dedup has no permissions to run the 'evalsha' command"),
	}
	neither := []error{
		op("dial", &net.DNSError{Err: "no such host", Name: "redis", IsNotFound: true}),
		redis.ErrClosed,
		context.DeadlineExceeded,
		context.Canceled,
	}
	broken := []error{
		op("write", os.NewSyscallError("write", syscall.ECONNRESET)),
		os.NewSyscallError("write", syscall.ECONNRESET), // go-redis unwraps a connection's setup error once
		op("read", os.NewSyscallError("read", syscall.ECONNRESET)),
		io.EOF, io.ErrUnexpectedEOF,
		op("write", os.NewSyscallError("write", syscall.EPIPE)),
		net.ErrClosed,
		op("dial", os.NewSyscallError("connect", syscall.ECONNRESET)), // accepted, then closed: no dial refused
	}
	type class int
	const (
		unclassified class = iota
		outage
		refusal
	)
	classOf := func(err error) class {
		switch {
		case errors.Is(err, stores.ErrUnavailable):
			return outage
		case errors.Is(err, ErrRefused):
			return refusal
		}
		return unclassified
	}
	names := []string{"unclassified", "an outage", "a refusal"}
	check := func(s *Store, when string, err error, want class) {
		t.Helper()
		got := s.classifyCall(context.Background(), fmt.Errorf("evalsha: %w", err))
		if c := classOf(got); c != want {
			t.Errorf("%s: %v: %v is %s, want %s", when, err, got, names[c], names[want])
		}
		if errors.Is(got, ErrRefused) && errors.Is(got, stores.ErrUnavailable) {
			t.Errorf("%s: %v is both a refusal and an outage", when, got)
		}
	}
	all := func(s *Store, when string, broke class) {
		t.Helper()
		for _, err := range outages {
			check(s, when, err, outage)
		}
		for _, err := range refusals {
			check(s, when, err, refusal)
		}
		for _, err := range neither {
			check(s, when, err, unclassified)
		}
		for _, err := range broken {
			check(s, when, err, broke)
		}
		// What the store classified before changes nothing.
		for _, before := range []error{nil, redis.Nil, replyError("NOPERM no"), refusals[0], broken[0]} {
			_ = s.classifyCall(context.Background(), before)
			check(s, when+", after "+fmt.Sprint(before), broken[0], broke)
		}
	}
	store := func(opts *redis.Options) *Store {
		c := redis.NewClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		return &Store{client: c}
	}

	all(store(&redis.Options{Addr: base.ClosedAddr(t), DialTimeout: time.Second}), "nothing listens any more", outage)
	all(store(&redis.Options{Addr: base.Serve(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 64))
		_, _ = c.Write([]byte("+PONG\r\n"))
	}), DialTimeout: time.Second}), "the server answers a new connection", unclassified)
	all(store(&redis.Options{Addr: base.Serve(t, func(c net.Conn) {}), DialTimeout: time.Second}),
		"the server takes a new connection and closes it", unclassified)
	cfg, refusing := tlsRefuser(t)
	all(store(&redis.Options{Addr: refusing, TLSConfig: cfg, DialTimeout: time.Second}),
		"the server refuses a new connection's certificate", refusal)

	// Without the call's context (a caller that does not pass it), or
	// with a cluster and no server named, nothing confirms a broken
	// connection: no known outage.
	s := store(&redis.Options{Addr: base.ClosedAddr(t)})
	for _, err := range broken {
		if got := s.classify(err); classOf(got) != unclassified {
			t.Errorf("%v without the call's context: %v, want unclassified", err, got)
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{base.ClosedAddr(t)}, DialTimeout: time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	sharded := &Store{client: cc, sharded: true}
	check(sharded, "a cluster, the node named", &net.OpError{Op: "read", Net: "tcp", Addr: tcpAddr(t, base.ClosedAddr(t)), Err: io.EOF}, outage)
	check(sharded, "a cluster, no node named", io.EOF, unclassified)

	// A confirmation the call's deadline cuts short is that deadline.
	hung := store(&redis.Options{Addr: base.Serve(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if got := hung.classifyCall(ctx, io.EOF); !errors.Is(got, context.DeadlineExceeded) || classOf(got) != unclassified {
		t.Errorf("a confirmation cut short by the call's deadline: %v, want context.DeadlineExceeded", got)
	}
}

func tcpAddr(t *testing.T, addr string) *net.TCPAddr {
	t.Helper()
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// tlsRefuser starts a TLS 1.3 server that requires a client certificate
// and returns a client configuration that trusts it and has none: the
// server's alert refuses it.
func tlsRefuser(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS13,
	}
	addr := base.Serve(t, func(c net.Conn) {
		tc := tls.Server(c, server)
		if tc.Handshake() == nil {
			_, _ = tc.Read(make([]byte, 64))
		}
		_ = tc.Close()
	})
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}, addr
}
