//go:build !unix

package main

import (
	"os"
	"syscall"
)

var sigKill, sigTerm = syscall.Signal(9), syscall.Signal(15)

// consumerSysProcAttr: no process groups here.
func consumerSysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup ends the consumer process pid: there are no signals to
// send it here, so both are a kill (a consumer process outlives this one
// if this one is killed).
func signalGroup(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
