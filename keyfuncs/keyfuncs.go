package keyfuncs

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tidwall/gjson"
)

// KeyFunc returns the dedup keys of msg. It must be deterministic: the same
// message (or the same logical event republished) must give the same keys on
// every delivery.
type KeyFunc func(msg *message.Message) ([]string, error)

// ErrNoKey is wrapped by every error a KeyFunc returns for a message it
// cannot key. It marks bad input, not a transient failure: retrying the
// message will not help.
var ErrNoKey = errors.New("no dedup key")

// MaxKeyLen is the longest key kept verbatim, in bytes. Longer keys are
// replaced by [Bound].
const MaxKeyLen = 256

// digestPrefix starts every digested key. A raw key can only collide with a
// digest by being a SHA-256 preimage.
const digestPrefix = "~sha256:"

// Bound returns key unchanged when it is at most MaxKeyLen bytes, and
// otherwise "~sha256:" followed by the unpadded base64url SHA-256 of key (51
// bytes). It never truncates: two long keys that share a prefix stay
// distinct.
func Bound(key string) string {
	if len(key) <= MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return digestPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}

// noKey builds the error for a message that cannot be keyed.
func noKey(msg *message.Message, format string, args ...any) error {
	return fmt.Errorf("%w: message %s: %s", ErrNoKey, Name(msg), fmt.Sprintf(format, args...))
}

// Name is how errors and logs name msg: its UUID, or "(no UUID)" for a
// message another producer published without one.
func Name(msg *message.Message) string {
	if msg.UUID == "" {
		return "(no UUID)"
	}
	return msg.UUID
}

// blank reports whether v holds nothing but white space (or nothing): no
// identity, and keying by it would make every such message a duplicate of
// the first.
func blank(v string) bool { return strings.TrimSpace(v) == "" }

// MessageID keys a message by its Watermill UUID. It catches broker
// redelivery of the same message, not a producer that republishes an event
// under a new id (combine it with a business key using [All]).
//
// A message published by a producer that is not Watermill usually has no
// UUID: Watermill's subscribers read it from a header of Watermill's own.
// The error then says, in short, how to key such messages, and links the
// README's section "Messages from other producers", which has the details
// for each broker: by the broker's own identity (kafkakeys.KafkaOffset or
// kafkakeys.RecordKey for Kafka; for RabbitMQ, amqpkeys.Marshaler as the
// subscriber's marshaler, which makes the AMQP message_id the UUID; for
// watermill-sql, the row's uuid column or sqlkeys.Offset; for NATS
// JetStream and Redis Streams, an unmarshaler that makes Nats-Msg-Id or the
// producer's id field the UUID), by a header the producer sets
// ([Metadata]), or by business fields ([JSON]). A UUID of white space
// counts as none.
func MessageID() KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		if msg.UUID == "" {
			return nil, fmt.Errorf("%w: %s, %s", ErrNoKey, noUUIDAdvice, noUUIDElse)
		}
		if blank(msg.UUID) {
			return nil, fmt.Errorf("%w: message UUID %q is blank: %s, %s", ErrNoKey, msg.UUID, noUUIDAdvice, noUUIDElse)
		}
		return []string{Bound(msg.UUID)}, nil
	}
}

// noUUIDAdvice is the error text of a message MessageID cannot key: short,
// one line in a log, with the README section that has the details.
const noUUIDAdvice = "no UUID (not from Watermill?): key it by the broker's id (kafkakeys, amqpkeys.Marshaler, sqlkeys; " +
	"NATS, Redis Streams: an unmarshaler setting it)"

// noUUIDElse is the rest of the advice, after noUUIDAdvice.
const noUUIDElse = "or by keyfuncs.Metadata or keyfuncs.JSON: see " + otherProducersURL

// otherProducersURL is the README section on keying messages from
// producers that are not Watermill.
const otherProducersURL = "https://github.com/watermill-dedup/dedup#messages-from-other-producers"

// Metadata keys a message by the value of a metadata header, such as an
// idempotency_key set by the producer. A missing, empty or blank (white
// space only) value gives an error wrapping [ErrNoKey].
func Metadata(name string) KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		v := msg.Metadata.Get(name)
		if v == "" {
			return nil, noKey(msg, "metadata %q is missing or empty", name)
		}
		if blank(v) {
			return nil, noKey(msg, "metadata %q is blank (%q)", name, v)
		}
		return []string{Bound(v)}, nil
	}
}

// JSON keys a message by business fields of its JSON payload, read with
// gjson path syntax (nested paths such as "payment.id" work) without
// unmarshalling the payload. Each path must hold a non-empty string, a
// number (kept exactly as written) or a boolean; the values are joined with
// ":" into one key, such as "PAY-4812:capture". A ':' or '\' inside a value
// is escaped with '\', so different field values can never join to the same
// key.
//
// A payload that is not valid JSON, or a path that is missing, null, empty,
// blank (white space only), an object or an array, gives an error wrapping
// [ErrNoKey].
func JSON(paths ...string) KeyFunc {
	if len(paths) == 0 {
		panic("keyfuncs.JSON: no paths")
	}
	return func(msg *message.Message) ([]string, error) {
		if !gjson.ValidBytes(msg.Payload) {
			return nil, noKey(msg, "payload is not valid JSON")
		}
		results := gjson.GetManyBytes(msg.Payload, paths...)
		var b strings.Builder
		for i, r := range results {
			if !r.Exists() {
				return nil, noKey(msg, "JSON field %q is missing", paths[i])
			}
			var v string
			switch r.Type {
			case gjson.String:
				v = r.Str
			case gjson.Number:
				v = r.Raw
			case gjson.True, gjson.False:
				v = r.Raw
			case gjson.Null:
				return nil, noKey(msg, "JSON field %q is null", paths[i])
			default:
				return nil, noKey(msg, "JSON field %q is an object or array, not a scalar", paths[i])
			}
			if v == "" {
				return nil, noKey(msg, "JSON field %q is empty", paths[i])
			}
			if blank(v) {
				return nil, noKey(msg, "JSON field %q is blank (%q)", paths[i], v)
			}
			if i > 0 {
				b.WriteByte(':')
			}
			writeEscaped(&b, v)
		}
		return []string{Bound(b.String())}, nil
	}
}

func writeEscaped(b *strings.Builder, v string) {
	if !strings.ContainsAny(v, `:\`) {
		b.WriteString(v)
		return
	}
	for i := 0; i < len(v); i++ {
		if v[i] == ':' || v[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
}

// PayloadSHA256 keys a message by the SHA-256 of its payload.
//
// Opt-in, and risky: identical payloads are not necessarily the same event.
// Two legitimate purchases of the same item for the same amount by the same
// customer can have byte-identical payloads, and this key would drop the
// second one. Use it only where the payload itself carries a unique event
// identity, or where dropping identical content is the intent. An empty
// payload gives an error wrapping [ErrNoKey].
func PayloadSHA256() KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		if len(msg.Payload) == 0 {
			return nil, noKey(msg, "empty payload")
		}
		sum := sha256.Sum256(msg.Payload)
		return []string{"sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])}, nil
	}
}

// All returns the keys of every fn, in order, without repeats: the message
// claims all of them in one record operation and is a duplicate when any was
// done. Any fn's error is returned. Use [Prefix] on each part so that a
// message id can never equal a business key by accident.
func All(fns ...KeyFunc) KeyFunc {
	if len(fns) == 0 {
		panic("keyfuncs.All: no key functions")
	}
	return func(msg *message.Message) ([]string, error) {
		var keys []string
		for _, fn := range fns {
			ks, err := fn(msg)
			if err != nil {
				return nil, err
			}
			for _, k := range ks {
				if !contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		return keys, nil
	}
}

func contains(keys []string, k string) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// First returns the keys of the first fn that can key the message: an error
// wrapping [ErrNoKey] moves on to the next fn, any other error is returned.
// When no fn can key the message the error wraps ErrNoKey and lists each
// reason.
func First(fns ...KeyFunc) KeyFunc {
	if len(fns) == 0 {
		panic("keyfuncs.First: no key functions")
	}
	return func(msg *message.Message) ([]string, error) {
		var errs []error
		for _, fn := range fns {
			keys, err := fn(msg)
			if err == nil {
				return keys, nil
			}
			if !errors.Is(err, ErrNoKey) {
				return nil, err
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
}

// Prefix prepends p to every key of fn, to namespace keys by their source
// ("msg:", "payment:") or by operation. The result is bounded again.
func Prefix(p string, fn KeyFunc) KeyFunc {
	return func(msg *message.Message) ([]string, error) {
		keys, err := fn(msg)
		if err != nil {
			return nil, err
		}
		out := make([]string, len(keys))
		for i, k := range keys {
			out[i] = Bound(p + k)
		}
		return out, nil
	}
}
