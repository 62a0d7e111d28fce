// Package testkit holds no code: its packages are the scaffolding tests
// share (harness runs the real daemon, wait polls for a state, indextest is
// the index conformance suite, enginepub and pypub publish engine events,
// logtest and testcerts), kept apart from the production helpers beside it
// in internal/ (redact, grpcbuf, kvsimcmd). The daemon never imports them;
// TestNoProductionImports holds that.
package testkit
