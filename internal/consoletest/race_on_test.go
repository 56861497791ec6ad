//go:build browser && race

package consoletest

// raceEnabled says the tests were built with -race.
const raceEnabled = true
