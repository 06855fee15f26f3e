package keyfuncs_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
)

func msg(payload string, md ...string) *message.Message {
	m := message.NewMessage("uuid-1", []byte(payload))
	for i := 0; i+1 < len(md); i += 2 {
		m.Metadata.Set(md[i], md[i+1])
	}
	return m
}

func keysOf(t *testing.T, fn keyfuncs.KeyFunc, m *message.Message) []string {
	t.Helper()
	keys, err := fn(m)
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	return keys
}

func noKey(t *testing.T, fn keyfuncs.KeyFunc, m *message.Message, want string) {
	t.Helper()
	keys, err := fn(m)
	if !errors.Is(err, keyfuncs.ErrNoKey) {
		t.Fatalf("got keys %q, error %v; want an error wrapping ErrNoKey", keys, err)
	}
	if !strings.Contains(err.Error(), m.UUID) || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q should name the message %s and %q", err, m.UUID, want)
	}
}

func TestMessageID(t *testing.T) {
	if got := keysOf(t, keyfuncs.MessageID(), msg("")); len(got) != 1 || got[0] != "uuid-1" {
		t.Fatalf("MessageID = %q", got)
	}
	// A message without a UUID (published by another producer) gets an
	// error saying how to key it, on every broker, in a few words and a
	// link to the README's section (#23: 700 characters, nothing for NATS
	// or Redis Streams).
	err := func() error { _, err := keyfuncs.MessageID()(message.NewMessage("", nil)); return err }()
	for _, want := range []string{"no UUID", "not from Watermill", "kafkakeys", "amqpkeys.Marshaler", "sqlkeys", "NATS", "Redis Streams", "keyfuncs.Metadata", "keyfuncs.JSON", readmeOtherProducers} {
		if !errors.Is(err, keyfuncs.ErrNoKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("MessageID() of a message without UUID: %v; want ErrNoKey mentioning %q", err, want)
		}
	}
	if n := len(err.Error()); n > 300 {
		t.Errorf("the error for a message without UUID is %d characters, want at most 300: %v", n, err)
	}
	// The link leads to a section of the README.
	readme, rerr := os.ReadFile("../README.md")
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !strings.Contains(string(readme), "\n## Messages from other producers\n") {
		t.Errorf("README.md has no section %q", readmeOtherProducers)
	}
}

// readmeOtherProducers is the README section errors point to.
const readmeOtherProducers = "https://github.com/watermill-dedup/dedup#messages-from-other-producers"

// TestBlankIDsAreNoKey: an id of white space is no identity. Keying by it
// would make every such message a duplicate of the first.
func TestBlankIDsAreNoKey(t *testing.T) {
	for _, id := range []string{" ", "\t", "\r\n", " \u00a0 "} {
		if keys, err := keyfuncs.MessageID()(message.NewMessage(id, nil)); !errors.Is(err, keyfuncs.ErrNoKey) {
			t.Errorf("MessageID() of UUID %q = %q, %v; want ErrNoKey", id, keys, err)
		}
		noKey(t, keyfuncs.Metadata("idempotency_key"), msg("", "idempotency_key", id), "blank")
		noKey(t, keyfuncs.JSON("id"), msg(fmt.Sprintf(`{"id":%q}`, id)), "blank")
	}
	// White space inside an id is kept as it is.
	if got := keysOf(t, keyfuncs.Metadata("k"), msg("", "k", " a b ")); got[0] != " a b " {
		t.Errorf("Metadata = %q, want the value unchanged", got)
	}
}

func TestErrorsNameMessagesWithoutUUID(t *testing.T) {
	_, err := keyfuncs.Metadata("idempotency_key")(message.NewMessage("", nil))
	if !errors.Is(err, keyfuncs.ErrNoKey) || !strings.Contains(err.Error(), "message (no UUID):") {
		t.Fatalf("error for a message without UUID = %q, want it named \"(no UUID)\"", err)
	}
}

func TestMetadata(t *testing.T) {
	fn := keyfuncs.Metadata("idempotency_key")
	if got := keysOf(t, fn, msg("", "idempotency_key", "abc")); got[0] != "abc" {
		t.Fatalf("Metadata = %q", got)
	}
	noKey(t, fn, msg(""), `metadata "idempotency_key" is missing`)
	noKey(t, fn, msg("", "idempotency_key", ""), `metadata "idempotency_key"`)
}

func TestJSON(t *testing.T) {
	payload := `{"payment_id":"PAY-4812","operation":"capture","amount":120.50,"n":7,"flag":true,"nested":{"id":"X"},"empty":"","nil":null,"obj":{},"arr":[1],"colon":"a:b","bs":"a\\b"}`
	cases := []struct {
		paths []string
		want  string
	}{
		{[]string{"payment_id", "operation"}, "PAY-4812:capture"},
		{[]string{"payment_id"}, "PAY-4812"},
		{[]string{"amount"}, "120.50"},
		{[]string{"n", "flag"}, "7:true"},
		{[]string{"nested.id"}, "X"},
		{[]string{"colon", "n"}, `a\:b:7`},
		{[]string{"bs"}, `a\\b`},
	}
	for _, c := range cases {
		got := keysOf(t, keyfuncs.JSON(c.paths...), msg(payload))
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("JSON(%q) = %q, want %q", c.paths, got, c.want)
		}
	}
	noKey(t, keyfuncs.JSON("missing"), msg(payload), `"missing" is missing`)
	noKey(t, keyfuncs.JSON("empty"), msg(payload), `"empty" is empty`)
	noKey(t, keyfuncs.JSON("nil"), msg(payload), `"nil" is null`)
	noKey(t, keyfuncs.JSON("obj"), msg(payload), "not a scalar")
	noKey(t, keyfuncs.JSON("arr"), msg(payload), "not a scalar")
	noKey(t, keyfuncs.JSON("payment_id"), msg(`not json`), "not valid JSON")
	noKey(t, keyfuncs.JSON("payment_id"), msg(`{"payment_id":"x"`), "not valid JSON")
}

func TestJSONNoAmbiguousJoin(t *testing.T) {
	fn := keyfuncs.JSON("a", "b")
	k1 := keysOf(t, fn, msg(`{"a":"x:y","b":"z"}`))[0]
	k2 := keysOf(t, fn, msg(`{"a":"x","b":"y:z"}`))[0]
	k3 := keysOf(t, fn, msg(`{"a":"x\\","b":":z"}`))[0]
	if k1 == k2 || k2 == k3 || k1 == k3 {
		t.Fatalf("distinct field values joined to the same key: %q %q %q", k1, k2, k3)
	}
}

func TestBound(t *testing.T) {
	short := strings.Repeat("a", keyfuncs.MaxKeyLen)
	if keyfuncs.Bound(short) != short {
		t.Fatal("a key of MaxKeyLen bytes was changed")
	}
	long1 := short + "1"
	long2 := short + "2"
	d1, d2 := keyfuncs.Bound(long1), keyfuncs.Bound(long2)
	if d1 == d2 {
		t.Fatal("two long keys sharing a prefix were given the same digest (truncation?)")
	}
	if len(d1) > keyfuncs.MaxKeyLen || d1 != keyfuncs.Bound(long1) {
		t.Fatalf("digest %q is not bounded or not stable", d1)
	}
	// Every factory bounds what it returns.
	got := keysOf(t, keyfuncs.Metadata("k"), msg("", "k", long1))
	if got[0] != d1 {
		t.Fatalf("Metadata did not bound a long key: %q", got[0])
	}
	got = keysOf(t, keyfuncs.JSON("k"), msg(fmt.Sprintf(`{"k":%q}`, long1)))
	if got[0] != d1 {
		t.Fatalf("JSON did not bound a long key: %q", got[0])
	}
}

func TestPayloadSHA256(t *testing.T) {
	fn := keyfuncs.PayloadSHA256()
	a := keysOf(t, fn, msg("same"))[0]
	b := keysOf(t, fn, msg("same"))[0]
	c := keysOf(t, fn, msg("other"))[0]
	if a != b || a == c {
		t.Fatalf("PayloadSHA256: %q %q %q", a, b, c)
	}
	noKey(t, fn, msg(""), "empty payload")
}

func TestAll(t *testing.T) {
	fn := keyfuncs.All(
		keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
		keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id")),
		keyfuncs.Prefix("msg:", keyfuncs.MessageID()), // a repeat is dropped
	)
	got := keysOf(t, fn, msg(`{"payment_id":"P1"}`))
	if strings.Join(got, ",") != "msg:uuid-1,payment:P1" {
		t.Fatalf("All = %q", got)
	}
	noKey(t, fn, msg(`{}`), `"payment_id" is missing`)
}

func TestFirst(t *testing.T) {
	fn := keyfuncs.First(keyfuncs.Metadata("idempotency_key"), keyfuncs.JSON("event_id"))
	if got := keysOf(t, fn, msg(`{"event_id":"E"}`, "idempotency_key", "H")); got[0] != "H" {
		t.Fatalf("First = %q, want the header", got)
	}
	if got := keysOf(t, fn, msg(`{"event_id":"E"}`)); got[0] != "E" {
		t.Fatalf("First = %q, want the JSON fallback", got)
	}
	_, err := fn(msg(`{}`))
	if !errors.Is(err, keyfuncs.ErrNoKey) || !strings.Contains(err.Error(), "idempotency_key") || !strings.Contains(err.Error(), "event_id") {
		t.Fatalf("First with nothing to key: %v", err)
	}
	boom := errors.New("boom")
	failing := keyfuncs.First(func(*message.Message) ([]string, error) { return nil, boom }, keyfuncs.MessageID())
	if _, err := failing(msg("")); !errors.Is(err, boom) {
		t.Fatalf("First must return a non-ErrNoKey error, got %v", err)
	}
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{"payment_id":"PAY-1","operation":"capture"}`, `{"a":{"b":[1,2]}}`, `{"payment_id":1e400}`, `[`, `"\u0000"`, ``, `{"payment_id":"` + strings.Repeat("x", 300) + `"}`} {
		f.Add([]byte(s))
	}
	fn := keyfuncs.JSON("payment_id", "operation", "a.b.0")
	single := keyfuncs.JSON("payment_id")
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := message.NewMessage("fuzz", payload)
		for _, kf := range []keyfuncs.KeyFunc{fn, single} {
			keys, err := kf(m)
			if err != nil {
				if !errors.Is(err, keyfuncs.ErrNoKey) {
					t.Fatalf("error not wrapping ErrNoKey: %v", err)
				}
				continue
			}
			if len(keys) != 1 || keys[0] == "" || len(keys[0]) > keyfuncs.MaxKeyLen {
				t.Fatalf("bad keys %q", keys)
			}
			again, _ := kf(m)
			if again[0] != keys[0] {
				t.Fatalf("unstable key: %q then %q", keys[0], again[0])
			}
		}
	})
}
