// Command kubestream drives a streaming URL with client-go's own clients (the code kubectl
// runs), so that crius's tests can check its streaming server, and kubelet's /exec, /attach
// and /portForward in front of it, against the real thing.
//
//	kubestream exec [-transport spdy|websocket] [-stdin] [-tty] URL
//	kubestream portforward [-transport spdy|websocket] URL LOCAL:REMOTE
//
// exec works for exec and attach URLs alike and exits with the remote command's exit code;
// any other failure is printed to stderr and exits 1. portforward listens on 127.0.0.1:LOCAL
// until it is killed or the session ends. No credentials are sent; https servers are not
// verified (the tests' certificates are self-signed).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"
)

const usage = `usage:
  kubestream exec [-transport spdy|websocket] [-stdin] [-tty] URL
  kubestream portforward [-transport spdy|websocket] URL LOCAL:REMOTE
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "exec":
		err = execCmd(os.Args[2:])
	case "portforward":
		err = portForwardCmd(os.Args[2:])
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err == nil {
		return
	}
	var exit utilexec.ExitError
	if errors.As(err, &exit) && exit.Exited() {
		os.Exit(exit.ExitStatus())
	}
	fmt.Fprintf(os.Stderr, "kubestream: %v\n", err)
	os.Exit(1)
}

// flags parses a subcommand's flags; it exits 2 when they, or the count of what follows
// them, are wrong.
func flags(name string, args []string, positional int, extra func(*flag.FlagSet)) (string, []string) {
	fs := flag.NewFlagSet("kubestream "+name, flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	transport := fs.String("transport", "spdy", "spdy or websocket")
	if extra != nil {
		extra(fs)
	}
	_ = fs.Parse(args)
	if fs.NArg() != positional || (*transport != "spdy" && *transport != "websocket") {
		fs.Usage()
		os.Exit(2)
	}
	return *transport, fs.Args()
}

// config is what client-go needs to reach the server: nothing but "do not verify".
func config() *rest.Config {
	return &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

func execCmd(args []string) error {
	var stdin, tty bool
	transport, pos := flags("exec", args, 1, func(fs *flag.FlagSet) {
		fs.BoolVar(&stdin, "stdin", false, "send this process's stdin")
		fs.BoolVar(&tty, "tty", false, "the stream is a terminal (stdout only, sized 80x24)")
	})
	target, err := url.Parse(pos[0])
	if err != nil {
		return err
	}

	var executor remotecommand.Executor
	if transport == "websocket" {
		// kubectl's WebSocket executor asks with GET, its SPDY one with POST.
		executor, err = remotecommand.NewWebSocketExecutor(config(), http.MethodGet, target.String())
	} else {
		executor, err = remotecommand.NewSPDYExecutor(config(), http.MethodPost, target)
	}
	if err != nil {
		return err
	}

	opts := remotecommand.StreamOptions{Stdout: os.Stdout, Tty: tty}
	if stdin {
		opts.Stdin = os.Stdin
	}
	if tty {
		opts.TerminalSizeQueue = &oneSize{}
	} else {
		opts.Stderr = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return executor.StreamWithContext(ctx, opts)
}

// oneSize tells the terminal's size once (80 columns, 24 rows), then nothing more.
type oneSize struct{ told bool }

func (q *oneSize) Next() *remotecommand.TerminalSize {
	if q.told {
		return nil
	}
	q.told = true
	return &remotecommand.TerminalSize{Width: 80, Height: 24}
}

func portForwardCmd(args []string) error {
	transport, pos := flags("portforward", args, 2, nil)
	target, err := url.Parse(pos[0])
	if err != nil {
		return err
	}

	var dialer httpstream.Dialer
	if transport == "websocket" {
		// SPDY tunnelled in WebSocket messages, as kubectl does it.
		dialer, err = portforward.NewSPDYOverWebsocketDialer(target, config())
		if err != nil {
			return err
		}
	} else {
		rt, upgrader, err := spdy.RoundTripperFor(config())
		if err != nil {
			return err
		}
		dialer = spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, target)
	}

	stop := make(chan struct{})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		close(stop)
	}()
	fw, err := portforward.NewOnAddresses(keepSession{dialer}, []string{"127.0.0.1"}, []string{pos[1]},
		stop, nil, io.Discard, os.Stderr)
	if err != nil {
		return err
	}
	return fw.ForwardPorts()
}

// keepSession hands the forwarder a session it cannot close. client-go's forwarder closes
// the whole session when one forwarded connection fails (say, nothing listens on the
// pod's port), which would end every other connection and this process; here only that
// connection ends, the error is logged, and the next connection is served. The session
// still ends when the server ends it, and with the process.
type keepSession struct{ httpstream.Dialer }

func (d keepSession) Dial(protocols ...string) (httpstream.Connection, string, error) {
	conn, protocol, err := d.Dialer.Dial(protocols...)
	if err != nil {
		return nil, protocol, err
	}
	return unclosable{conn}, protocol, nil
}

type unclosable struct{ httpstream.Connection }

func (unclosable) Close() error { return nil }
