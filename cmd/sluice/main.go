// Command sluice runs Sluice, a rate-limit-aware job mesh for LLM API calls
// on NATS JetStream. `sluice help` lists the commands.
package main

import (
	"fmt"
	"os"
)

func main() {
	ctx, stop := signals() // signals.go
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "sluice: %v\n", err)
		os.Exit(1)
	}
}
