package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/sluice-dev/sluice/examples"
)

const initUsage = `Usage: sluice init [--example NAME] [--force] [FILE]

sluice init writes a commented example configuration to FILE (default sluice.yaml)
and prints what to run next. It never overwrites a file unless --force is given.

Examples (--example):
  sim               the provider simulator as provider: no account, no API key (default)
  openai-anthropic  OpenAI and Anthropic, with a fallback from one to the other

Flags:
`

// nextSteps is what to run after `sluice init` writes each example.
var nextSteps = map[string]string{
	"sim": `Next, in two terminals:
  sluice sim                                    # the provider simulator on 127.0.0.1:8090
  export SLUICE_DEMO_KEY=dev-key-change-me      # the key HTTP callers send
  sluice up --config %[1]s
Then:
  curl -s http://127.0.0.1:8080/v1/chat/completions \
    -H "Authorization: Bearer $SLUICE_DEMO_KEY" -H "Content-Type: application/json" \
    -d '{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
`,
	"openai-anthropic": `Next: set the limits in %[1]s to your accounts' limits, then
  export OPENAI_API_KEY=sk-...  ANTHROPIC_API_KEY=sk-ant-...
  export ACME_SLUICE_KEY=$(openssl rand -hex 24)  # the key your callers send
  sluice up --check --config %[1]s               # checks the file and those variables
  sluice up --config %[1]s
`,
}

func runInit(_ context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("init", stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), initUsage)
		fs.PrintDefaults()
	}
	name := fs.String("example", examples.Default, "the example to write: "+strings.Join(examples.Names(), ", "))
	force := fs.Bool("force", false, "overwrite FILE if it exists")
	// Flags may come before or after FILE.
	var path string
	err := fs.Parse(args)
	if err == nil && fs.NArg() > 0 {
		path = fs.Arg(0)
		err = fs.Parse(fs.Args()[1:])
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("init: give at most one FILE, got %q and %q (see sluice init -h)", path, fs.Arg(0))
	}
	if path == "" {
		path = "sluice.yaml"
	}
	data, err := examples.Config(*name)
	if err != nil {
		return fmt.Errorf("init --example: %w", err)
	}
	if err := writeNew(path, data, *force); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (example %q)\n\n", path, *name)
	fmt.Fprintf(stdout, nextSteps[*name], path)
	return nil
}

// writeNew writes data to path; it refuses to replace a file unless force.
func writeNew(path string, data []byte, force bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("init: %s already exists; keep it (sluice up --config %s), or replace it with sluice init --force %s", path, path, path)
	}
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("init: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("init: write %s: %w", path, err)
	}
	return nil
}
