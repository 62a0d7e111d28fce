// Package e2e tests the kvindexd binary as an operator runs it: built and
// stamped as make build does, stopped by signals, and flooded by hostile
// publishers under its default memory bound. It holds tests only; what they
// share with other suites is in internal/testkit.
package e2e
