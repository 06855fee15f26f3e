package sqlstore

// SetPurgeHook makes s report the size of every purge batch to f.
func SetPurgeHook(s *Store, f func(n int64)) { s.onPurgeBatch = f }

// SetPurgeChunk sets the number of heap blocks a PostgreSQL purge
// statement reads.
func SetPurgeChunk(s *Store, blocks int64) { s.purgeChunk = blocks }

// SetBatchHook makes s report the size of every batch to f before it runs
// (1 for a lone call); an error f returns for a batch of several calls
// stands for a failed batch statement. It returns false when s does not
// batch. Call it before the store is used.
func SetBatchHook(s *Store, f func(n int) error) bool {
	if s.group == nil {
		return false
	}
	s.group.hook = f
	return true
}

// BatchCallers returns how many calls are inside the batcher (queued,
// running or deciding), once SetBatchHook was called.
func BatchCallers(s *Store) int64 { return s.group.inDo.Load() }

// LockingRead is a statement that locks several records, with its args.
type LockingRead struct {
	Stmt string
	Args []any
}

// LockingReads returns s's reads that lock the records of two ids.
func LockingReads(s *Store) map[string]LockingRead {
	ids := []recordID{digest("s", "a"), digest("s", "b")}
	return map[string]LockingRead{
		"owned":      {s.q.owned(2, true), idArgs(s.d, []any{int64(1)}, ids)},
		"selectRows": {s.q.selectRows(2, true), idArgs(s.d, []any{s.d.timeArg(s.now())}, ids)},
	}
}
