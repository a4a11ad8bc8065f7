package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// sighup carries the SIGHUPs the process receives: `sluice up` reloads its
// configuration on each (up.go); no command ends on one.
var sighup = make(chan os.Signal, 1)

// stopSignal is the cause of the context signals returns when a SIGINT or
// SIGTERM ends it.
type stopSignal struct{ name string }

func (s stopSignal) Error() string { return s.name + " received" }

// signals returns a context that SIGINT or SIGTERM ends, its cause naming
// the signal, and routes SIGHUP to sighup. stop stops both.
func signals() (context.Context, func()) {
	signal.Notify(sighup, syscall.SIGHUP)
	ctx, cancel := context.WithCancelCause(context.Background())
	stops := make(chan os.Signal, 1)
	signal.Notify(stops, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-stops:
			name := "SIGTERM"
			if s == os.Interrupt {
				name = "SIGINT"
			}
			cancel(stopSignal{name})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(stops)
		signal.Stop(sighup)
		cancel(nil)
	}
}

// followSignals logs the end of ctx ("shutting down", naming the signal)
// and passes each SIGHUP to reloads, logged, until ctx ends. The function
// it returns waits for that last line when ctx has ended (call it before
// the command returns: its log may be the caller's buffer).
func followSignals(ctx context.Context, log interface {
	Info(msg string, args ...any)
}, reloads chan<- string) (wait func()) {
	logged := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(logged)
		reason := context.Cause(ctx)
		if s, ok := reason.(stopSignal); ok {
			log.Info("shutting down", "signal", s.name)
			return
		}
		log.Info("shutting down", "reason", reason.Error())
	})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-sighup:
				log.Info("reloading configuration", "signal", "SIGHUP")
				select {
				case reloads <- "SIGHUP":
				default: // one is pending: it reads the file as it is by then
				}
			}
		}
	}()
	return func() {
		if !stop() { // ctx ended: the line is being written
			<-logged
		}
	}
}
