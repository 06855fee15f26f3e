package testkit

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultNATSURL is the NATS server (with JetStream) the natsstore tests
// use unless NATS_URL says otherwise.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATSURL is NATS_URL or nats://127.0.0.1:4222.
func NATSURL() string { return env("NATS_URL", DefaultNATSURL) }

// NATSAddr is the host:port of NATSURL.
func NATSAddr() string { return hostPort(NATSURL(), "127.0.0.1:4222") }

// RequireNATS returns the NATS URL after checking the server answers, or
// fails the test naming it when it does not (see Unavailable). JetStream must be enabled on it (nats-server -js).
func RequireNATS(t testing.TB) string {
	t.Helper()
	u := NATSURL()
	RequireTCP(t, "NATS", NATSAddr())
	return u
}

// JetStream connects to the NATS server at url for a test and returns its
// JetStream API, failing t when either does not open. The connection
// closes when t ends.
func JetStream(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
