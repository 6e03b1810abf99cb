// Package testkit holds the helpers podvm's tests share: a buffer safe
// for a writer and a reader at once, writers that fail or dawdle, tar
// streams built from and read into entries, and the gate that skips a
// test whose service is missing, or fails it under CI.
//
// It imports nothing of podvm, so that any package's tests, and vm/vmtest,
// can use it. It never runs a command.
package testkit
