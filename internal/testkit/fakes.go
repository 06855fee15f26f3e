package testkit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/stores"
)

// Recorder is a message.Publisher that keeps what it is given, and fails
// its first FailNext calls with Err. It is shared by a library package's
// own tests and its tests on every store (internal/onstores), which are
// two packages.
type Recorder struct {
	FailNext int   // fail this many calls, then succeed
	Err      error // what a failed call returns

	mu     sync.Mutex
	got    []*message.Message
	calls  int
	closed bool
}

func (r *Recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.FailNext > 0 {
		r.FailNext--
		return r.Err
	}
	r.got = append(r.got, msgs...)
	return nil
}

func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

// UUIDs are the UUIDs of the messages of the calls that succeeded, in
// order.
func (r *Recorder) UUIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.got {
		out = append(out, m.UUID)
	}
	return out
}

// Calls is the number of Publish calls, failed ones included.
func (r *Recorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Closed reports whether Close was called.
func (r *Recorder) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// HookStore is a store whose calls a test replaces; a nil hook calls the
// store underneath. It counts the Claims that reach it.
type HookStore struct {
	stores.Store
	OnCaps     func(stores.Capabilities) stores.Capabilities
	OnClaim    func(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error)
	OnComplete func(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error
	OnRelease  func(ctx context.Context, c *stores.Claim) error
	Claims     atomic.Int32
}

func (s *HookStore) Capabilities() stores.Capabilities {
	if s.OnCaps != nil {
		return s.OnCaps(s.Store.Capabilities())
	}
	return s.Store.Capabilities()
}

func (s *HookStore) Claim(ctx context.Context, scope string, keys []string, lease time.Duration) (*stores.Claim, error) {
	s.Claims.Add(1)
	if s.OnClaim != nil {
		return s.OnClaim(ctx, scope, keys, lease)
	}
	return s.Store.Claim(ctx, scope, keys, lease)
}

func (s *HookStore) Complete(ctx context.Context, c *stores.Claim, retention time.Duration, data []byte) error {
	if s.OnComplete != nil {
		return s.OnComplete(ctx, c, retention, data)
	}
	return s.Store.Complete(ctx, c, retention, data)
}

func (s *HookStore) Release(ctx context.Context, c *stores.Claim) error {
	if s.OnRelease != nil {
		return s.OnRelease(ctx, c)
	}
	return s.Store.Release(ctx, c)
}

// MustNew returns newFn(store, cfg), a constructor's result, and fails t
// on its error.
func MustNew[C, T any](t testing.TB, newFn func(stores.Store, C) (T, error), store stores.Store, cfg C) T {
	t.Helper()
	v, err := newFn(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// keyRepository is Watermill's ExpiringKeyRepository: what
// expiringkeys.Repository implements.
type keyRepository interface {
	IsDuplicate(ctx context.Context, key string) (bool, error)
}

// IsDuplicate calls r.IsDuplicate and fails t on an error.
func IsDuplicate(t testing.TB, r keyRepository, key string) bool {
	t.Helper()
	dup, err := r.IsDuplicate(context.Background(), key)
	if err != nil {
		t.Fatalf("IsDuplicate(%q): %v", key, err)
	}
	return dup
}

// MustSee fails t unless r.IsDuplicate(key) is want; why says what the
// check is.
func MustSee(t testing.TB, r keyRepository, key string, want bool, why string) {
	t.Helper()
	if got := IsDuplicate(t, r, key); got != want {
		t.Fatalf("IsDuplicate(%q) = %t, want %t: %s", key, got, want, why)
	}
}
