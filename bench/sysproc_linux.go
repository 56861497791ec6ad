package main

import "syscall"

// childSysProcAttr makes a child die with the bench, should the bench be
// killed before it could stop its children.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
