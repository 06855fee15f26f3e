package sqlstore

// SetPurgeHook makes s report the size of every purge batch to f.
func SetPurgeHook(s *Store, f func(n int64)) { s.onPurgeBatch = f }
