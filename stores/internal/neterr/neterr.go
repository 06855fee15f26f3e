// Package neterr tells the network errors every store meets the same
// way, whatever its driver: a dial that is a known outage, a connection
// that broke with no word of why, a TLS handshake that refused the
// client. Each store adds its driver's and its server's own errors.
package neterr

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"reflect"
	"syscall"
)

// DialOutage reports a dial that failed as a known outage: refused
// (nothing listens), timed out, the host or network unreachable, a name
// the resolver could not look up now. A name that does not exist is a
// setting to fix, and a dial the other end reset (it accepted, then
// closed) is no outage either: a server or a balancer turning the client
// away looks so.
func DialOutage(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return !dns.IsNotFound
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ETIMEDOUT) || Timeout(err) || Unreachable(err)
}

// Timeout reports a timeout (a net.Error's, context.DeadlineExceeded
// included).
func Timeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Unreachable reports a network or host that cannot be reached.
func Unreachable(err error) bool {
	return errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETDOWN) || errors.Is(err, syscall.EHOSTDOWN)
}

// ConnLost reports a connection that broke under the client: reset or
// closed (an EOF, a broken pipe, a connection closed under the call). It
// says nothing of why: a server that died, and also one that turned the
// client away (a TLS 1.3 server's close may overtake its alert).
func ConnLost(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}

// TLSRefused reports a TLS handshake that failed: the server's alert (a
// certificate it does not accept, or none where it requires one, a TLS
// version or cipher it does not take), which crypto/tls returns as a
// *net.OpError, or alone when a driver unwrapped it; the client's own (a
// local error); a server certificate that does not verify; a server that
// does not answer in TLS.
func TLSRefused(err error) bool {
	var (
		op     *net.OpError
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
		alert  tls.AlertError
		ua     x509.UnknownAuthorityError
		host   x509.HostnameError
		inv    x509.CertificateInvalidError
	)
	return (errors.As(err, &op) && (op.Op == "remote error" || op.Op == "local error")) ||
		errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert) ||
		errors.As(err, &ua) || errors.As(err, &host) || errors.As(err, &inv) || tlsAlert(err)
}

// tlsAlert reports crypto/tls's alert (an unexported type) found in
// err's chain on its own, not in the *net.OpError crypto/tls puts it in.
func tlsAlert(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if t := reflect.TypeOf(e); t.PkgPath() == "crypto/tls" && t.Name() == "alert" {
			return true
		}
	}
	return false
}
