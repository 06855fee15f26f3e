package storeopen

import (
	"context"

	"github.com/watermill-dedup/dedup/stores/memstore"
)

// memoryKind is memstore, inside the process: no service, no settings.
var memoryKind = &Kind{
	Name: "memory",
	open: func(_ context.Context, _ Opener, r Request, out *Opened) error {
		cfg, err := configOf[memstore.Config](out.Kind, r)
		if err != nil {
			return err
		}
		s, err := memstore.New(cfg)
		if err != nil {
			return err
		}
		out.setStore(s)
		out.Addr, out.Records = "in-process", "in-process"
		return nil
	},
}
