package neterr

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
)

func TestClasses(t *testing.T) {
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, c := range []struct {
		name                  string
		err                   error
		dial, lost, tlsRefuse bool
	}{
		{"dial refused", dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), true, false, false},
		{"dial timed out", dial(os.ErrDeadlineExceeded), true, false, false},
		{"context deadline", fmt.Errorf("dial: %w", context.DeadlineExceeded), true, false, false},
		{"host unreachable", dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), true, false, false},
		{"name not found", dial(&net.DNSError{Err: "no such host", Name: "db", IsNotFound: true}), false, false, false},
		{"resolver down", dial(&net.DNSError{Err: "timeout", Name: "db", IsTimeout: true}), true, false, false},
		{"dial reset", dial(os.NewSyscallError("connect", syscall.ECONNRESET)), false, true, false},
		{"EOF", fmt.Errorf("read: %w", io.EOF), false, true, false},
		{"broken pipe", &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}, false, true, false},
		{"TLS alert", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, false, false, true},
		{"untrusted server", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, false, false, true},
		{"not TLS", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false, false, true},
		{"foreign", errors.New("something else"), false, false, false},
	} {
		if got := DialOutage(c.err); got != c.dial {
			t.Errorf("%s: DialOutage = %v, want %v", c.name, got, c.dial)
		}
		if got := ConnLost(c.err); got != c.lost {
			t.Errorf("%s: ConnLost = %v, want %v", c.name, got, c.lost)
		}
		if got := TLSRefused(c.err); got != c.tlsRefuse {
			t.Errorf("%s: TLSRefused = %v, want %v", c.name, got, c.tlsRefuse)
		}
	}
}
