package batch

import "fmt"

// Config configures the group commit of a store. Each store has a
// BatchConfig of its own with these fields, documenting what a batch is
// for it, its defaults and its bounds (a [Limits]), and converts it to a
// Config. The zero value turns batching on with the store's defaults.
type Config struct {
	// Disabled turns group commit off: every call runs on its own, one
	// round trip each.
	Disabled bool

	// MaxBatch is the most calls one batch carries. 0 means the store's
	// default.
	MaxBatch int

	// MaxInFlight is the most batches (and lone calls) out at once, each
	// on a connection of its own; calls arriving while that many are out
	// wait and go out together in the next batch. 0 means the store's
	// default.
	MaxInFlight int
}

// Limits are one store's defaults and upper bounds for the fields of a
// Config.
type Limits struct {
	DefaultMaxBatch, MaxBatch       int
	DefaultMaxInFlight, MaxInFlight int
}

// Validate reports the first field of c outside l's bounds, named as the
// Batch field of a store's Config is ("Batch.MaxBatch must be ..."); the
// store prefixes the error with its name.
func (c Config) Validate(l Limits) error {
	if c.MaxBatch < 0 || c.MaxBatch > l.MaxBatch {
		return fmt.Errorf("Batch.MaxBatch must be between 1 and %d (0 for the default, %d), got %d", l.MaxBatch, l.DefaultMaxBatch, c.MaxBatch)
	}
	if c.MaxInFlight < 0 || c.MaxInFlight > l.MaxInFlight {
		return fmt.Errorf("Batch.MaxInFlight must be between 1 and %d (0 for the default, %d), got %d", l.MaxInFlight, l.DefaultMaxInFlight, c.MaxInFlight)
	}
	return nil
}

// WithDefaults returns c with l's default in each zero field.
func (c Config) WithDefaults(l Limits) Config {
	if c.MaxBatch == 0 {
		c.MaxBatch = l.DefaultMaxBatch
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = l.DefaultMaxInFlight
	}
	return c
}

// NewFromConfig returns a Batcher for exec configured by c (with its
// defaults set), or nil when c.Disabled.
func NewFromConfig[Req, Resp any](exec Exec[Req, Resp], c Config) *Batcher[Req, Resp] {
	if c.Disabled {
		return nil
	}
	return New(exec, c.MaxBatch, c.MaxInFlight)
}
