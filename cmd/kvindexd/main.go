// Command kvindexd is the KV-cache indexer daemon: it subscribes to the
// KV-cache events of vLLM and SGLang engines, keeps an index of which pod
// holds which prefix block, and answers routers over gRPC and HTTP.
//
//	kvindexd [serve] [flags]     run the daemon (default)
//	kvindexd help                list subcommands
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

func init() {
	subcommands["serve"] = subcommand{"run the daemon (the default when no subcommand is given)", runServe}
	subcommands["help"] = subcommand{"list subcommands; `kvindexd help NAME` shows NAME's flags", runHelp}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	name := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if name == "-h" || name == "--help" {
		name = "help"
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
		fmt.Fprintf(stderr, "kvindexd %s: %s\n", name, redact.Error(err))
		return 1
	}
	return 0
}

func printSubcommands(w io.Writer) {
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
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

// runServe runs the daemon until SIGINT or SIGTERM.
func runServe(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, os.Getenv, stderr)
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
