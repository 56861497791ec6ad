package fakemodel

// The names below are unexported; the package's external tests use them.
const Overloaded = overloaded

var Words = words
