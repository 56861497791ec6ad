// Package consoletest drives the web console (package console, served by
// serve -http-listen at "/") in a real browser: Debian's chromium, headless,
// through github.com/chromedp/chromedp, against an in-process Stubborn
// server and demo delegates on loopback.
//
// The tests are behind the build tag "browser", so that `make test` needs
// only Go:
//
//	make testbrowser   # go test -tags browser ./consoletest/...
//
// They need chromium (apt-get install chromium; STUBBORN_CHROMIUM names
// another binary). Without it they fail under CI and skip elsewhere.
// Screenshots go to testdata/artifacts/ (STUBBORN_ARTIFACTS names another
// folder); STUBBORN_UPDATE_SCREENSHOTS=1 also writes the run's timeline to
// docs/console-run.png. Performance figures are logged as lines
// "PERF name=value" and appended to the file STUBBORN_PERF_OUT names.
package consoletest
