package middleware

import (
	"crypto/sha256"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/stores"
)

// DefaultScope is the scope of a message handled outside a router (no
// handler name in its context) when Config.Scope is empty.
const DefaultScope = "default"

// Config configures the middleware. The zero value of every field but
// Store means its documented default, so a common configuration is a few
// lines:
//
//	middleware.Config{
//		Store: store,
//		Key:   keyfuncs.All(keyfuncs.Prefix("msg:", keyfuncs.MessageID()), keyfuncs.Prefix("pay:", keyfuncs.JSON("payment_id"))),
//		Policy: dedup.Policy{
//			Retention: 72 * time.Hour,
//			Logger:    logger,
//		},
//	}
type Config struct {
	// Store keeps the dedup records. Required. New refuses a Policy the
	// store cannot honour (a Lease or Retention beyond its
	// stores.Capabilities).
	Store stores.Store

	// Mode is how a message is recorded done: dedup.ModeLease (the
	// default), dedup.ModeAsyncComplete or dedup.ModeTransactional (the
	// transactional inbox: the handler finds the transaction with
	// sqlstore.TxFromContext).
	Mode dedup.Mode

	// Key builds the keys a message claims. The default is
	// keyfuncs.MessageID(). For side-effecting consumers whose producers
	// may republish an event under a new id, claim both the id and a
	// business key with keyfuncs.All.
	Key keyfuncs.KeyFunc

	// Scope separates the records of different consumers of the same
	// messages. The default is the Watermill handler name from the message
	// context, so every handler does its work once; outside a router (no
	// handler name) it is DefaultScope. Set it to share records between
	// handlers, or to keep them stable when a handler is renamed.
	Scope string

	// PublishedAt tells when a message was first published, for the
	// ttl-miss check: a claimed message older than Retention may be a
	// redelivery whose record already expired, and is counted
	// (dedup.OutcomeTTLMiss) and logged, never hidden. Nil disables the
	// check. See MetadataTime and the PublishedAt functions of the
	// keyfuncs broker packages.
	PublishedAt func(msg *message.Message) (time.Time, bool)

	// Fingerprint, when set, is stored with each done record; a duplicate
	// whose fingerprint differs (the same key reused for different
	// content) fails with an error wrapping dedup.ErrFingerprintMismatch
	// instead of being acked. See PayloadFingerprint.
	Fingerprint func(msg *message.Message) []byte

	// Policy holds the settings the middleware shares with the publisher
	// decorator: Lease, Retention, StoreTimeout, OnStoreError,
	// InProgressWait, Logger, Metrics and Tuning. See dedup.Policy for
	// each field and its default.
	dedup.Policy
}

// Validate reports the first invalid field, naming it and the bound, or
// a setting the store cannot honour, naming the store's bound. Its errors
// wrap dedup.ErrInvalidConfig.
func (c Config) Validate() error {
	_, err := c.cycle()
	return err
}

// cycle returns the claim cycle of a valid c.
func (c Config) cycle() (*cycle.Cycle, error) {
	return cycle.New(c.Store, c.Policy, cycle.Consumer, cycle.Needs{
		Mode: c.Mode, Scope: c.Scope, Fingerprint: c.Fingerprint, PublishedAt: c.PublishedAt,
	})
}

// PayloadFingerprint is a Config.Fingerprint: the first 16 bytes of the
// SHA-256 of the payload.
func PayloadFingerprint(msg *message.Message) []byte {
	sum := sha256.Sum256(msg.Payload)
	return sum[:16]
}

// MetadataTime returns a Config.PublishedAt that reads an RFC 3339 time
// from the named metadata header.
func MetadataTime(name string) func(*message.Message) (time.Time, bool) {
	return func(msg *message.Message) (time.Time, bool) {
		v := msg.Metadata.Get(name)
		if v == "" {
			return time.Time{}, false
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		return t, err == nil
	}
}
