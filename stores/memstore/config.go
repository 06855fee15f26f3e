package memstore

import (
	"fmt"
	"time"

	"github.com/watermill-dedup/dedup/stores"
)

// The configuration of a Store: Config, its defaults and validation.

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Shards is the number of independently locked maps. The default is 64;
	// it must be a power of two no larger than 65536.
	Shards int

	// SweepInterval is how often expired records are removed. The default
	// is one minute. Expired records are never treated as live, whether or
	// not the sweeper has run; sweeping only bounds memory.
	SweepInterval time.Duration

	// Clock tells the time; nil means the system clock. Tests inject a fake.
	Clock stores.Clock
}

// Default values of Config fields.
const (
	DefaultShards        = 64
	DefaultSweepInterval = time.Minute
)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Shards < 0 || c.Shards > 1<<16 || (c.Shards > 0 && c.Shards&(c.Shards-1) != 0) {
		return fmt.Errorf("memstore: Shards must be a power of two between 1 and 65536, got %d", c.Shards)
	}
	if c.SweepInterval < 0 {
		return fmt.Errorf("memstore: SweepInterval must not be negative, got %s", c.SweepInterval)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	c.Clock = stores.ClockOrSystem(c.Clock)
}
