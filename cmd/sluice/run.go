package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/sluice-dev/sluice/internal/version"
)

const usage = `sluice: a rate-limit-aware job mesh for LLM API calls on NATS JetStream

Usage: sluice <command> [flags]

Commands:
  demo     run the mesh and a provider simulator with limits that bind, submit a
           mixed workload from several tenants, show live progress and a summary
  bench    compare retry-only, a request limiter, token shaping and Sluice on the
           same simulated limits; 'bench overhead' measures what the mesh adds
  init     write a commented example configuration (sluice.yaml) and say what to run next
  up       run Sluice (embedded NATS by default; --nats-url joins a cluster);
           'up --check' checks a configuration and names every problem
  sim      run the OpenAI-compatible provider simulator
  queue    show what waits: depth, oldest age, estimated wait per tenant and priority
  submit   send one job over NATS and print its result
  jobs     list a tenant's jobs ('jobs list') or cancel one ('jobs cancel ID')
  reload   have every process re-read its configuration file and apply it
  dlq      list, show and replay dead-lettered jobs
  cache    show the response cache's size ('cache stats') or empty it ('cache purge')
  nats-auth  print the nats-server authorization block (service and tenant
           users with their permissions) for an external NATS
  version  print the version

Run 'sluice <command> -h' for a command's flags.
`

// run is the whole program; tests call it directly.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "", usage, map[string]command{
		"init":      runInit,
		"up":        runUp,
		"sim":       runSim,
		"demo":      runDemo,
		"bench":     runBench,
		"queue":     runQueue,
		"submit":    runSubmit,
		"jobs":      runJobs,
		"reload":    runReload,
		"dlq":       runDLQ,
		"cache":     runCache,
		"nats-auth": runNATSAuth,
		"version":   runVersion,
		"--version": runVersion,
	}, args, getenv, stdout, stderr)
}

// newFlagSet makes a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args; -h is a clean exit.
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return false, nil
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// command is a (sub)command's entry point, given the arguments after its name.
type command func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// dispatch runs the command that args[0] names. help, -h and --help print
// usage to stdout; no name or an unknown one prints it to stderr and is an
// error, prefixed with the group's name ("dlq: ") for a group's commands.
func dispatch(ctx context.Context, group, usage string, cmds map[string]command, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	prefix := ""
	if group != "" {
		prefix = group + ": "
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New(prefix + "no command given")
	}
	name, rest := args[0], args[1:]
	if cmd, ok := cmds[name]; ok {
		return cmd(ctx, rest, getenv, stdout, stderr)
	}
	if name == "help" || name == "-h" || name == "--help" {
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("%sunknown command %q", prefix, name)
}

// runVersion prints the build: the module's version (or the commit built),
// revision, commit time and Go version (internal/version).
func runVersion(_ context.Context, _ []string, _ func(string) string, stdout, _ io.Writer) error {
	fmt.Fprintln(stdout, "sluice", version.Get())
	return nil
}
