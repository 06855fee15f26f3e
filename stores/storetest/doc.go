// Package storetest is the conformance suite for [stores.Store]
// implementations. Every store in this module runs it, and a third-party
// store can too, with one line:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock stores.Clock) stores.Store {
//			s, err := mystore.New(mystore.Config{Clock: clock})
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { _ = s.Close(context.Background()) })
//			return s
//		})
//	}
//
// The suite drives expiry through the clock it hands the factory, so it
// never sleeps. A store that keeps time on its server (Redis PX expiry, say)
// ignores the clock and passes [ServerTime] with a way to move that time
// for its records, or [RealTime]: the suite then uses sub-second leases
// and really waits, which a loaded machine can upset.
//
// Run checks what [stores.Store.Capabilities] states: each bound is
// accepted and one more is refused before any I/O, changing nothing, and
// the booleans agree with the interfaces the store implements.
//
// On a store that implements [stores.Admin], Run also checks the admin
// interface (Get, List, Delete, Stats, Purge); [AdminNoScopes] and
// [AdminNoKeys] tell it what the store's layout cannot list.
//
// On a store that implements [stores.OwnerClaimer] (Capabilities.Owners),
// Run checks the owners a claim keeps and returns; on one that does not,
// those tests skip.
//
// [RunModel] checks the same contract another way: it runs long random
// sequences of calls (edge durations, cancelled contexts, forged claims,
// concurrent calls, Close) and checks every answer against a reference
// model of the state machine. Options tell it what the store documents
// of itself:
//
//	func TestModel(t *testing.T) {
//		storetest.RunModel(t, func(t *testing.T, clock stores.Clock) stores.Store {
//			s, err := mystore.New(mystore.Config{Clock: clock})
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { _ = s.Close(context.Background()) })
//			return s
//		}, storetest.Precision(time.Microsecond), storetest.MaxKeyLen(1024))
//	}
//
// A failure prints a seed; STORETEST_SEED=<seed> go test -run TestModel
// replays that sequence, and STORETEST_MODEL_STEPS=<n> runs n steps per
// store instead of the default few seconds' worth.
//
// It is shipped as a normal package, not a _test file, in the manner of
// Watermill's pubsub/tests, so other modules can import it.
package storetest
