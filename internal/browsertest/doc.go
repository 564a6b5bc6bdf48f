// Package browsertest is test support for the tests that drive the admin
// console in headless Chromium (chromedp): finding the browser, and failing
// a test on what the page writes to the browser's console.
//
// Only _test.go files import it: it imports chromedp and the testing
// package, which no package of the binary may.
package browsertest
