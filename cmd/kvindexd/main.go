// Command kvindexd is the KV-cache indexer daemon: it subscribes to the
// KV-cache events of vLLM, SGLang and TensorRT-LLM engines, keeps an index of
// which pod holds which prefix block, and answers routers over gRPC and HTTP.
//
//	kvindexd [serve] [flags]     run the daemon (default)
//	kvindexd help                list subcommands
//	kvindexd version             print the version (also --version)
//	kvindexd <subcommand> ...    developer and debugging tools
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/kvindex/kvindex/internal/redact"
)

// subcommand is one `kvindexd <name>` tool. Owners of other packages add
// theirs from their own file: func init() { subcommands["x"] = subcommand{...} }.
type subcommand struct {
	summary string
	run     func(args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

var subcommands = map[string]subcommand{}

// hiddenSubcommands are left out of `kvindexd help`: project tooling, not
// for operators.
var hiddenSubcommands = map[string]bool{}

func init() {
	subcommands["serve"] = subcommand{"run the daemon (the default when no subcommand is given)", runServe}
	subcommands["help"] = subcommand{"list subcommands; `kvindexd help NAME` shows NAME's flags", runHelp}
	subcommands["version"] = subcommand{"print the version, VCS commit and Go version (also --version)", runVersion}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	name := "serve"
	switch {
	case len(args) == 0:
	case args[0] == "--version" || args[0] == "-version":
		name, args = "version", args[1:]
	case args[0] == "-h" || args[0] == "--help" || args[0] == "-help":
		// Without a subcommand: the list of them (serve's flags are one
		// `kvindexd help serve` away).
		name, args = "help", args[1:]
	case len(args[0]) > 0 && args[0][0] != '-':
		name, args = args[0], args[1:]
	}
	sc, ok := subcommands[name]
	if !ok {
		fmt.Fprintf(stderr, "kvindexd: unknown subcommand %q\n\n", name)
		printSubcommands(stderr)
		return 2
	}
	if err := sc.run(args, stdin, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		// Redaction is for errors (a bad --index value echoes its URL);
		// help text is printed as written.
		fmt.Fprintf(stderr, "kvindexd %s: %s\n", name, redact.Error(err))
		if errors.As(err, new(usageError)) {
			fmt.Fprintf(stderr, "Run 'kvindexd %s --help' for usage.\n", name)
			return 2
		}
		return 1
	}
	return 0
}

func printSubcommands(w io.Writer) {
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		if !hiddenSubcommands[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: kvindexd [subcommand] [flags]\n\nsubcommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, subcommands[n].summary)
	}
}

func runHelp(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		sc, ok := subcommands[args[0]]
		if !ok {
			return fmt.Errorf("unknown subcommand %q", args[0])
		}
		if args[0] == "help" {
			printSubcommands(stdout)
			return nil
		}
		return sc.run([]string{"-h"}, stdin, stdout, stdout)
	}
	printSubcommands(stdout)
	return nil
}

// usageError is a command line the flag set rejected (unknown flag, bad
// value, stray argument): run prints it with a pointer to --help and exits
// 2, rather than the whole flag list (over 150 lines for serve) that hides
// the one line that matters.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// parseFlags parses args with fs. A parse error comes back as a usageError
// and prints nothing; -h / --help prints fs's usage, verbatim, to help and
// returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, help io.Writer) error {
	usage := fs.Usage
	if usage == nil {
		usage = func() {
			fmt.Fprintf(fs.Output(), "usage: %s [flags]\n\nflags:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	// The flag package prints the error and the usage on its own for any
	// failure; silence it and decide here.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(help)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	case err != nil:
		return usageError{err}
	case fs.NArg() > 0:
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return nil
}

// runServe runs the daemon until SIGINT or SIGTERM, then shuts it down
// gracefully and returns nil (exit status 0: an operator's Ctrl-C or a
// Kubernetes stop is not a failure).
func runServe(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, os.Getenv, stdout)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	d, err := newDaemon(ctx, cfg, log)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
