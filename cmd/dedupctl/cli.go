package main

import "io"

// cli runs one command; errors go to its caller.
type cli struct {
	cfg *config
	out io.Writer
}
