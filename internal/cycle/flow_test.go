package cycle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/internal/cycle"
	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/stores"
)

func TestDecide(t *testing.T) {
	msg := newMsg("m")
	keys := []string{"k"}
	cases := []struct {
		name     string
		policy   dedup.Policy
		r        stores.Result
		takeover bool
		err      error
		want     cycle.Verdict
		wantErr  error
		counted  dedup.Outcome
	}{
		{name: "claimed", r: stores.Claimed, want: cycle.Run},
		{name: "takeover", r: stores.Claimed, takeover: true, want: cycle.Run, counted: dedup.OutcomeTakeover},
		{name: "duplicate", r: stores.Duplicate, want: cycle.Skip},
		{name: "in progress", r: stores.InProgress, want: cycle.Busy},
		{name: "outside the contract", r: stores.Result(99), want: cycle.Fail},
		{name: "outage, fail-closed", err: stores.ErrUnavailable, want: cycle.Fail, wantErr: dedup.ErrStore, counted: dedup.OutcomeStoreError},
		{name: "outage, fail-open", policy: dedup.Policy{OnStoreError: dedup.FailOpen}, err: stores.ErrUnavailable,
			want: cycle.Bypass, counted: dedup.OutcomeBypassed},
		{name: "unclassified, fail-open", policy: dedup.Policy{OnStoreError: dedup.FailOpen}, err: errReset,
			want: cycle.Fail, wantErr: dedup.ErrStore, counted: dedup.OutcomeStoreError},
		{name: "key refused", err: stores.ErrInvalidKey, want: cycle.Fail, wantErr: stores.ErrInvalidKey, counted: dedup.OutcomeNoKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := e.cycle(cycle.Consumer, tc.policy, cycle.Needs{})
			v, err := c.Decide(msg, "s", keys, tc.r, tc.takeover, tc.err)
			if v != tc.want {
				t.Fatalf("verdict %d, want %d (err %v)", v, tc.want, err)
			}
			switch {
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			case tc.want == cycle.Fail && err == nil:
				t.Fatal("Fail without an error")
			case tc.want != cycle.Fail && err != nil:
				t.Fatalf("err = %v with verdict %d", err, v)
			}
			if tc.counted != 0 && e.metrics.Outcome(tc.counted) != 1 {
				t.Fatalf("%s counted %d times, want 1", tc.counted, e.metrics.Outcome(tc.counted))
			}
			if tc.counted == 0 && e.metrics.Outcome(dedup.OutcomeClaimed) != 0 {
				t.Fatal("Decide counted a claim: Claimed does, once the effect runs")
			}
		})
	}
}

func TestClaimAndDecide(t *testing.T) {
	t.Run("free", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		cl, v, err := c.ClaimAndDecide(newMsg("m"), "s", []string{"k"}, func(*stores.Claim) (*stores.Claim, error) {
			t.Fatal("own wait called for keys that are free")
			return nil, nil
		})
		if err != nil || v != cycle.Run || cl == nil || cl.Result != stores.Claimed {
			t.Fatalf("ClaimAndDecide = %v, %d, %v", cl, v, err)
		}
	})
	t.Run("own wait frees the keys", func(t *testing.T) {
		e := newEnv(t)
		// No InProgressWait: an Await instead of the own wait fails at once.
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		held := e.claimed(c, "k")
		owns := 0
		cl, v, err := c.ClaimAndDecide(newMsg("m"), "s", []string{"k"}, func(got *stores.Claim) (*stores.Claim, error) {
			owns++
			if got.Result != stores.InProgress {
				t.Fatalf("own wait given %s", got.Result)
			}
			if err := c.Release(context.Background(), held, false); err != nil {
				t.Fatal(err)
			}
			return c.Claim(context.Background(), "s", []string{"k"})
		})
		if err != nil || v != cycle.Run || cl.Result != stores.Claimed || owns != 1 {
			t.Fatalf("ClaimAndDecide = %v, %d, %v after %d own waits", cl, v, err, owns)
		}
		if n := e.store.claims.Load(); n != 3 {
			t.Fatalf("%d claims, want 3: the held one, the first, the own wait's; no Await", n)
		}
	})
	t.Run("still held after the wait", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: 5 * time.Millisecond, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}, cycle.Needs{})
		e.claimed(c, "k")
		cl, v, err := c.ClaimAndDecide(newMsg("m"), "s", []string{"k"}, nil)
		if v != cycle.Fail || cl != nil || !errors.Is(err, dedup.ErrInProgress) {
			t.Fatalf("ClaimAndDecide = %v, %d, %v; want Fail with ErrInProgress", cl, v, err)
		}
		if e.metrics.Outcome(dedup.OutcomeInProgress) != 1 {
			t.Fatalf("in_progress counted %d times", e.metrics.Outcome(dedup.OutcomeInProgress))
		}
	})
	t.Run("a claim fails during the wait", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{InProgressWait: time.Hour, Tuning: dedup.Tuning{InProgressPoll: time.Millisecond}}, cycle.Needs{})
		e.claimed(c, "k")
		e.store.claim = func(n int) (*stores.Claim, error) {
			if n >= 3 {
				return nil, errReset
			}
			return nil, nil
		}
		cl, v, err := c.ClaimAndDecide(newMsg("m"), "s", []string{"k"}, nil)
		if v != cycle.Fail || cl != nil || !errors.Is(err, dedup.ErrStore) || !errors.Is(err, errReset) {
			t.Fatalf("ClaimAndDecide = %v, %d, %v; want Fail with the store's error", cl, v, err)
		}
	})
	t.Run("own wait fails", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{OnStoreError: dedup.FailOpen}, cycle.Needs{})
		e.claimed(c, "k")
		cl, v, err := c.ClaimAndDecide(newMsg("m"), "s", []string{"k"}, func(*stores.Claim) (*stores.Claim, error) {
			return nil, fmt.Errorf("claim: %w", stores.ErrUnavailable)
		})
		if v != cycle.Bypass || cl != nil || err != nil {
			t.Fatalf("ClaimAndDecide = %v, %d, %v; want an outage bypassed under FailOpen", cl, v, err)
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		if got, _ := complete(c, context.Background(), newMsg("m"), e.claimed(c, "k"), []byte{1, 0, 0}); got != cycle.Done {
			t.Fatalf("Complete = %v", got)
		}
		cl, v, err := c.ClaimAndDecide(newMsg("m"), "s", []string{"k"}, nil)
		if v != cycle.Skip || err != nil || cl == nil || string(cl.Data) != string([]byte{1, 0, 0}) {
			t.Fatalf("ClaimAndDecide = %v, %d, %v; want Skip with the record's data", cl, v, err)
		}
	})
}

func TestClaimed(t *testing.T) {
	at := time.Now()
	ok := true
	e := newEnv(t)
	c := e.cycle(cycle.Consumer, dedup.Policy{Retention: time.Hour}, cycle.Needs{
		PublishedAt: func(*message.Message) (time.Time, bool) { return at, ok },
	})
	c.Claimed(newMsg("m"), "s", []string{"k"})
	if e.metrics.Outcome(dedup.OutcomeClaimed) != 1 || e.metrics.Outcome(dedup.OutcomeTTLMiss) != 0 {
		t.Fatalf("a fresh message: claimed %d, ttl_miss %d", e.metrics.Outcome(dedup.OutcomeClaimed), e.metrics.Outcome(dedup.OutcomeTTLMiss))
	}
	at = time.Now().Add(-2 * time.Hour)
	c.Claimed(newMsg("m"), "s", []string{"k"})
	if e.metrics.Outcome(dedup.OutcomeTTLMiss) != 1 || !strings.Contains(e.errorLogs(), "retention window") {
		t.Fatalf("an old message: ttl_miss %d, log %q", e.metrics.Outcome(dedup.OutcomeTTLMiss), e.errorLogs())
	}
	ok = false
	c.Claimed(newMsg("m"), "s", []string{"k"})
	if e.metrics.Outcome(dedup.OutcomeTTLMiss) != 1 || e.metrics.Outcome(dedup.OutcomeClaimed) != 3 {
		t.Fatal("a message without a publication time counted as a ttl miss")
	}
	plain := e.cycle(cycle.Consumer, dedup.Policy{Retention: time.Hour}, cycle.Needs{})
	plain.Claimed(newMsg("m"), "s", []string{"k"})
	if e.metrics.Outcome(dedup.OutcomeClaimed) != 4 || e.metrics.Outcome(dedup.OutcomeTTLMiss) != 1 {
		t.Fatal("Claimed without PublishedAt")
	}
	t.Run("exactly Retention old", func(t *testing.T) {
		// On the bubble's clock: a message exactly Retention old is still
		// within the window; a nanosecond older is not.
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			age := time.Hour
			c := e.cycle(cycle.Consumer, dedup.Policy{Retention: time.Hour}, cycle.Needs{
				PublishedAt: func(*message.Message) (time.Time, bool) { return time.Now().Add(-age), true },
			})
			c.Claimed(newMsg("m"), "s", []string{"k"})
			if n := e.metrics.Outcome(dedup.OutcomeTTLMiss); n != 0 {
				t.Fatalf("a message exactly Retention old: ttl_miss %d, want 0", n)
			}
			age++
			c.Claimed(newMsg("m"), "s", []string{"k"})
			if n := e.metrics.Outcome(dedup.OutcomeTTLMiss); n != 1 {
				t.Fatalf("a message a nanosecond older than Retention: ttl_miss %d, want 1", n)
			}
		})
	})
}

func TestRun(t *testing.T) {
	fp := cycle.Needs{Fingerprint: func(*message.Message) []byte { return []byte("fp") }}
	t.Run("succeeds", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, fp)
		cl := e.claimed(c, "k")
		msg := newMsg("m")
		parent := msg.Context()
		out := message.NewMessage("out", []byte("x"))
		outputs, data, hb, err := c.Run(msg, cl, func(m *message.Message) ([]*message.Message, error) {
			if got, ok := cycle.ClaimFromContext(m.Context()); !ok || got != cl {
				t.Fatal("the effect's context does not carry the claim")
			}
			return []*message.Message{out}, nil
		})
		if err != nil || len(outputs) != 1 || hb == nil {
			t.Fatalf("Run = %v, %v, %v", outputs, hb, err)
		}
		if msg.Context() != parent {
			t.Fatal("the message's context is still the beat after Run")
		}
		gotFP, kept, derr := record.Decode(data)
		if derr != nil || string(gotFP) != "fp" || len(kept) != 1 || kept[0].UUID != "out" {
			t.Fatalf("data decodes to %q, %v, %v", gotFP, kept, derr)
		}
		got, err := c.Finish(hb.Detached(), msg, hb, data, outputs)
		if err != nil || len(got) != 1 || got[0] != out {
			t.Fatalf("Finish = %v, %v", got, err)
		}
		if s, _ := e.state("k"); s != stores.StateDone {
			t.Fatalf("record %s, want done", s)
		}
	})
	t.Run("fails", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		msg := newMsg("m")
		parent := msg.Context()
		boom := errors.New("boom")
		_, _, hb, err := c.Run(msg, e.claimed(c, "k"), func(*message.Message) ([]*message.Message, error) { return nil, boom })
		if err != boom || hb != nil || msg.Context() != parent {
			t.Fatalf("Run = %v, %v", hb, err)
		}
		if _, held := e.state("k"); held || e.metrics.Outcome(dedup.OutcomeReleased) != 1 {
			t.Fatalf("claim held %v, released %d: want it released and counted", held, e.metrics.Outcome(dedup.OutcomeReleased))
		}
	})
	t.Run("panics", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		msg := newMsg("m")
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the effect's panic", r)
				}
			}()
			_, _, _, _ = c.Run(msg, e.claimed(c, "k"), func(*message.Message) ([]*message.Message, error) { panic("boom") })
		}()
		if _, held := e.state("k"); held {
			t.Fatal("a panicking effect left its claim held")
		}
	})
	t.Run("fingerprint panics", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{Fingerprint: func(*message.Message) []byte { panic("fp") }})
		func() {
			defer func() { _ = recover() }()
			_, _, _, _ = c.Run(newMsg("m"), e.claimed(c, "k"), func(*message.Message) ([]*message.Message, error) { return nil, nil })
		}()
		if _, held := e.state("k"); held {
			t.Fatal("a panicking fingerprint left the claim held")
		}
	})
}

func TestFinish(t *testing.T) {
	mine := message.NewMessage("mine", nil)
	run := func(t *testing.T, e *env, c *cycle.Cycle) ([]*message.Message, error) {
		t.Helper()
		msg := newMsg("m")
		outputs, data, hb, err := c.Run(msg, e.claimed(c, "k"), func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{mine}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return c.Finish(context.Background(), msg, hb, data, outputs)
	}
	t.Run("done before, with outputs", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		earlier := record.Encode(nil, []*message.Message{message.NewMessage("earlier", nil)})
		e.store.complete = func(int, []byte) error { return stores.ErrLostClaim }
		e.store.claim = func(n int) (*stores.Claim, error) {
			if n > 1 {
				return &stores.Claim{Result: stores.Duplicate, Data: earlier}, nil
			}
			return nil, nil
		}
		got, err := run(t, e, c)
		if err != nil || len(got) != 1 || got[0].UUID != "earlier" {
			t.Fatalf("Finish = %v, %v; want the outputs recorded before", got, err)
		}
	})
	t.Run("done before, without outputs", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		e.store.complete = func(int, []byte) error { return stores.ErrLostClaim }
		e.store.claim = func(n int) (*stores.Claim, error) {
			if n > 1 {
				return &stores.Claim{Result: stores.Duplicate}, nil
			}
			return nil, nil
		}
		got, err := run(t, e, c)
		if err != nil || len(got) != 1 || got[0] != mine {
			t.Fatalf("Finish = %v, %v; want this run's outputs", got, err)
		}
	})
	t.Run("taken over", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{}, cycle.Needs{})
		e.store.complete = func(int, []byte) error { return stores.ErrLostClaim }
		e.store.extend = func(int) error { return stores.ErrLostClaim }
		e.store.claim = func(n int) (*stores.Claim, error) {
			if n > 1 {
				return &stores.Claim{Result: stores.InProgress}, nil
			}
			return nil, nil
		}
		got, err := run(t, e, c)
		if got != nil || !errors.Is(err, stores.ErrLostClaim) || !strings.HasPrefix(err.Error(), "dedup: ") {
			t.Fatalf("Finish = %v, %v; want a nack with ErrLostClaim", got, err)
		}
	})
	t.Run("not recorded", func(t *testing.T) {
		e := newEnv(t)
		c := e.cycle(cycle.Consumer, dedup.Policy{Tuning: dedup.Tuning{CompleteTimeout: time.Millisecond}}, cycle.Needs{})
		e.store.complete = func(int, []byte) error { return stores.ErrClosed }
		got, err := run(t, e, c)
		if err != nil || len(got) != 1 || got[0] != mine {
			t.Fatalf("Finish = %v, %v; want this run's outputs acked", got, err)
		}
	})
}

func TestRunInTx(t *testing.T) {
	e := newEnv(t)
	store := &inboxStore{fake: e.store, inbox: true}
	fp := func(*message.Message) []byte { return []byte("fp") }
	c, err := cycle.New(store, dedup.Policy{Metrics: e.metrics, Logger: e.logger}, cycle.Consumer, cycle.Needs{Mode: dedup.ModeTransactional, Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	msg := newMsg("m")
	parent := msg.Context()

	ok := &tx{}
	out, err := c.RunInTx(msg, "s", []string{"k"}, ok, func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("o", nil)}, nil
	})
	if err != nil || len(out) != 1 || len(ok.commits) != 1 || ok.rollbacks != 0 || msg.Context() != parent {
		t.Fatalf("RunInTx = %v, %v; commits %d, rollbacks %d", out, err, len(ok.commits), ok.rollbacks)
	}
	if gotFP, kept, err := record.Decode(ok.commits[0]); err != nil || string(gotFP) != "fp" || len(kept) != 1 {
		t.Fatalf("committed data decodes to %q, %v, %v", gotFP, kept, err)
	}

	failed := &tx{}
	boom := errors.New("boom")
	if _, err := c.RunInTx(msg, "s", []string{"k"}, failed, func(*message.Message) ([]*message.Message, error) { return nil, boom }); err != boom {
		t.Fatalf("RunInTx = %v, want the handler's error", err)
	}
	if len(failed.commits) != 0 || failed.rollbacks != 1 || e.metrics.Outcome(dedup.OutcomeReleased) != 1 {
		t.Fatalf("a failed handler: commits %d, rollbacks %d, released %d", len(failed.commits), failed.rollbacks, e.metrics.Outcome(dedup.OutcomeReleased))
	}
	if logs := e.errorLogs(); logs != "" {
		t.Fatalf("a rollback that succeeded was logged: %q", logs)
	}
	unrolled := &tx{rollbackErr: errReset}
	if _, err := c.RunInTx(msg, "s", []string{"k"}, unrolled, func(*message.Message) ([]*message.Message, error) { return nil, boom }); err != boom {
		t.Fatalf("RunInTx = %v, want the handler's error, not the rollback's", err)
	}
	if unrolled.rollbacks != 1 || e.metrics.Outcome(dedup.OutcomeReleased) != 2 || !strings.Contains(e.errorLogs(), "rollback failed") {
		t.Fatalf("a failed rollback: rollbacks %d, released %d, log %q; want it counted and logged", unrolled.rollbacks, e.metrics.Outcome(dedup.OutcomeReleased), e.errorLogs())
	}

	refused := &tx{commit: func([]byte) error { return errReset }}
	_, err = c.RunInTx(msg, "s", []string{"k"}, refused, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if !errors.Is(err, dedup.ErrStore) || !errors.Is(err, errReset) || refused.rollbacks != 1 || e.metrics.Outcome(dedup.OutcomeStoreError) != 1 {
		t.Fatalf("a failed commit: %v, rollbacks %d, store errors %d", err, refused.rollbacks, e.metrics.Outcome(dedup.OutcomeStoreError))
	}

	panicked := &tx{}
	func() {
		defer func() { _ = recover() }()
		_, _ = c.RunInTx(msg, "s", []string{"k"}, panicked, func(*message.Message) ([]*message.Message, error) { panic("boom") })
	}()
	if panicked.rollbacks != 1 || msg.Context() != parent {
		t.Fatalf("a panicking handler: rollbacks %d", panicked.rollbacks)
	}
}
