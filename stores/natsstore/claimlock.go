package natsstore

import (
	"context"
	"sync"
)

// claimLocks serialise the fenced calls (Complete, Release, Extend) of
// one claim within the process. Two of them at once (a heartbeat's
// Extend beside the Complete) each read the claim's keys and write them
// at the revision read: the one whose write lands second finds its key
// changed and starts again, and a loop of Extends, whose read-to-write
// cycle is as long as the Complete's, kept landing first: the Complete
// lost every attempt (storetest's CompleteBesideExtend failed with "the
// claim's own calls changed its keys 10 times in a row", in 9 of 80
// runs, and still at 100 attempts). One at a time, a Complete waits for
// at most the Extend in flight. Calls of one claim from several
// processes (a token handed over) still race, and are tried again (see
// errOwnRace).
type claimLocks struct {
	mu sync.Mutex
	m  map[string]*claimLock
}

// claimLock is the lock of one claim's token: a semaphore, so that a
// wait can end with its context, and the number of calls holding or
// waiting for it, to drop it from the map after the last.
type claimLock struct {
	sem chan struct{}
	n   int
}

// lock takes the lock of token, or returns ctx's error when ctx ends
// first. unlock must be called once it is taken.
func (l *claimLocks) lock(ctx context.Context, token string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*claimLock{}
	}
	cl := l.m[token]
	if cl == nil {
		cl = &claimLock{sem: make(chan struct{}, 1)}
		l.m[token] = cl
	}
	cl.n++
	l.mu.Unlock()
	done := func() {
		l.mu.Lock()
		if cl.n--; cl.n == 0 {
			delete(l.m, token)
		}
		l.mu.Unlock()
	}
	select {
	case cl.sem <- struct{}{}:
		return func() { <-cl.sem; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}
