//go:build !linux

package main

import "syscall"

// childSysProcAttr is nil here: a child outlives a bench that is killed
// (the roles end when their stdin closes).
func childSysProcAttr() *syscall.SysProcAttr { return nil }
