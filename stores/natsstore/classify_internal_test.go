package natsstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/watermill-dedup/dedup/stores"
)

// TestClassify: the class of each error nats.go and JetStream return
// while a server restarts, a cluster elects a leader or is overloaded,
// as their own values (the README lists them). The leader elections of a
// cluster are checked here by their error values: JetStream answers 503
// "JetStream system temporarily unavailable" (10008) while a stream or
// the meta group has no leader, and a publish to a stream whose leader
// is gone gets no responders, or no ack before its deadline. A
// connection that is not up (closed, draining, reconnecting, stale) or
// broke (an EOF, a reset) is no outage by itself: the store asks the
// servers of its pool (connWatch.down, TestSessionClosedIsNotAnOutage).
func TestClassify(t *testing.T) {
	api := func(code int, ec jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: ec, Description: desc})
	}
	const (
		outage = iota
		tooLarge
		refused
		none
	)
	alert := &net.OpError{Op: "remote error", Net: "tcp", Err: errors.New("tls: certificate required")}
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"no responders", nats.ErrNoResponders, outage},
		{"no response from stream", jetstream.ErrNoStreamResponse, outage},
		{"request timeout", nats.ErrTimeout, outage},
		{"the client's own deadline (the caller's context alive)", context.DeadlineExceeded, outage},
		{"connection closed", nats.ErrConnectionClosed, none},
		{"connection draining", nats.ErrConnectionDraining, none},
		{"reconnecting", nats.ErrConnectionReconnecting, none},
		{"no servers", nats.ErrNoServers, outage},
		{"stale connection", nats.ErrStaleConnection, none},
		{"max connections", nats.ErrMaxConnectionsExceeded, outage},
		{"EOF", io.EOF, none},
		{"JetStream not enabled (a server starting)", jetstream.ErrJetStreamNotEnabled, outage},
		{"JetStream not enabled for the account (a user moved to another account)", api(503, jetstream.JSErrCodeJetStreamNotEnabledForAccount, "jetstream not enabled for account"), none},
		{"server shutdown", jetstream.ErrServerShutdown, outage},
		{"leader election: system temporarily unavailable", api(503, 10008, "JetStream system temporarily unavailable"), outage},
		{"insufficient resources", api(503, 10023, "insufficient resources"), outage},
		{"stream offline", api(500, 10118, "stream is offline"), outage},
		{"maximum payload exceeded", nats.ErrMaxPayload, tooLarge},
		{"message size exceeds maximum", api(400, jetstream.JSErrCodeStreamMessageExceedsMaximum, "message size exceeds maximum allowed"), tooLarge},
		{"bucket full (discard new)", api(503, jsErrCodeStoreLimit, "maximum bytes exceeded"), none},
		{"stream not found (bucket deleted)", api(404, jetstream.JSErrCodeStreamNotFound, "stream not found"), none},
		{"permissions violation", nats.ErrPermissionViolation, none},
		{"authorization", nats.ErrAuthorization, refused},
		{"authentication expired", nats.ErrAuthExpired, refused},
		{"authentication revoked", nats.ErrAuthRevoked, refused},
		{"the server's TLS alert (a net.Error)", alert, refused},
		{"the server's TLS alert, at connect", fmt.Errorf("%w: %w", nats.ErrTLS, alert), refused},
		{"closed right after the TLS handshake (a certificate refused under TLS 1.3)", fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, io.EOF), refused},
		{"a TLS handshake that timed out (a server that does not answer)", fmt.Errorf("%w: %w", nats.ErrTLS, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), outage},
		{"a server certificate the client does not trust", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, refused},
		{"TLS required by the server", nats.ErrSecureConnRequired, refused},
		{"TLS wanted by the client", nats.ErrSecureConnWanted, refused},
		{"a reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, none},
		{"a dial refused (nothing listens)", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, outage},
		{"a dial that timed out", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, outage},
		{"a dial the other end reset (accepted, then closed)", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNRESET)}, none},
		{"a name that does not resolve", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "nats", IsNotFound: true}}, none},
		{"foreign value", errForeign, none},
	} {
		got := classify(context.Background(), nil, c.err)
		isOutage, isTooLarge, isRefused := errors.Is(got, stores.ErrUnavailable), errors.Is(got, stores.ErrTooLarge), errors.Is(got, ErrRefused)
		if isOutage != (c.want == outage) || isTooLarge != (c.want == tooLarge) || isRefused != (c.want == refused) {
			t.Errorf("%s: classify = %v; ErrUnavailable %t, ErrTooLarge %t, ErrRefused %t", c.name, got, isOutage, isTooLarge, isRefused)
		}
	}
	// The caller's own context ending is its class, whatever failed.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := classify(ctx, nil, nats.ErrTimeout); errors.Is(got, stores.ErrUnavailable) || !errors.Is(got, context.Canceled) {
		t.Errorf("a cancelled caller's timeout: classify = %v, want context.Canceled", got)
	}
}
