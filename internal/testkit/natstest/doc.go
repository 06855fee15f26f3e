// Package natstest starts nats-server processes and clusters of a test's
// own, on Debian's nats-server or on a current one built from the Go
// module proxy, and opens JetStream for a test. It imports nats.go and
// testkit only.
package natstest
