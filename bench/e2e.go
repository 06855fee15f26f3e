package main

import "context"

func runE2E(ctx context.Context, o *options) ([]result, error) {
	return skipped("e2e", "not wired yet"), nil
}
