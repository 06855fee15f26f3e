package dedup

import (
	"errors"

	"github.com/watermill-dedup/dedup/keyfuncs"
)

// Errors returned by the middleware, the publisher and their New. Errors
// of the store (stores.ErrLostClaim, ...) and of key functions
// (keyfuncs.ErrNoKey) are wrapped, so errors.Is finds them too. Every
// error starts with "dedup: ".
var (
	// ErrInvalidConfig is wrapped by every error of a Config's Validate
	// and New, including a setting the store cannot honour.
	ErrInvalidConfig = errors.New("dedup: invalid config")

	// ErrRetentionTooShort is wrapped by the error of CheckHorizon.
	ErrRetentionTooShort = errors.New("dedup: retention shorter than the redelivery horizon allows")

	// ErrInProgress is returned for a message whose keys another consumer
	// or producer holds under a live claim. It is retryable: nothing ran,
	// nothing was published; the message is nacked, not lost.
	ErrInProgress = errors.New("dedup: message is being processed by another consumer or producer")

	// ErrStore wraps a failed store call that stops the message before
	// its effect: a Claim or Begin that failed (under FailClosed, or for
	// any error but an outage under FailOpen), or a Commit.
	ErrStore = errors.New("dedup: store call failed")

	// ErrFingerprintMismatch reports a duplicate whose key was recorded
	// with a different fingerprint (middleware.Config.Fingerprint): the
	// same key reused for other content. It is permanent (see
	// IsPermanent).
	ErrFingerprintMismatch = errors.New("dedup: key reused with a different payload fingerprint")

	// ErrCorruptRecord reports stored record data that cannot be decoded.
	// It is permanent.
	ErrCorruptRecord = errors.New("dedup: corrupt stored record data")
)

// IsPermanent reports whether err marks bad input that no retry will fix:
// a message without a key (keyfuncs.ErrNoKey), a key reused with a
// different payload (ErrFingerprintMismatch) or corrupt stored data
// (ErrCorruptRecord). Use it as the filter of Watermill's
// PoisonQueueWithFilter. The middleware and the publisher log each such
// error at error level and count it before returning it.
func IsPermanent(err error) bool {
	return errors.Is(err, keyfuncs.ErrNoKey) ||
		errors.Is(err, ErrFingerprintMismatch) ||
		errors.Is(err, ErrCorruptRecord)
}
