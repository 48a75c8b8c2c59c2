// Command nri-logger is an NRI plugin for crius's tests: it logs every pod and container
// event it is told of, and can put one environment variable into every container it sees
// created. It rejects nothing.
//
// Each event is logged as a line `EVENT: WHAT:` (say `RunPodSandbox: pod:`) followed by
// what it carries as YAML, one line each, indented: `EVENT:    name: web`.
//
// It runs either on its own (flags below), or started by the runtime from its plugin
// directory, which names it and hands it a connection in the environment and may pass a
// YAML configuration:
//
//	logFile: /path/to/log   # where to log (else stderr)
//	events: [RunPodSandbox, StopPodSandbox]   # what to subscribe to (else everything)
//	setEnv: NAME            # set NAME=logger-pid-PID in every container created
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var log = logrus.StandardLogger()

type config struct {
	LogFile string   `yaml:"logFile"`
	Events  []string `yaml:"events"`
	SetEnv  string   `yaml:"setEnv"`
}

type plugin struct {
	events api.EventMask // from -events; 0 is everything
	setEnv string
}

func main() {
	var (
		name       = flag.String("name", "", "plugin name (default: from the binary's name)")
		idx        = flag.String("idx", "", "plugin index, two digits (default: from the binary's name)")
		socketPath = flag.String("socket-path", api.DefaultSocketPath, "NRI socket to connect to")
		logFile    = flag.String("log-file", "", "log to this file (default: stderr)")
		events     = flag.String("events", "all", "comma-separated events to subscribe to")
		setEnv     = flag.String("set-env", "", "set this variable to logger-pid-PID in every container")
	)
	flag.Parse()
	log.SetFormatter(&logrus.TextFormatter{DisableColors: true, FullTimestamp: true})
	if *logFile != "" {
		if err := logTo(*logFile); err != nil {
			log.Fatal(err)
		}
	}

	p := &plugin{setEnv: *setEnv}
	mask, err := api.ParseEventMask(*events)
	if err != nil {
		log.Fatalf("-events: %v", err)
	}
	if mask != api.ValidEvents {
		p.events = mask
	}

	var opts []stub.Option
	if *name != "" {
		opts = append(opts, stub.WithPluginName(*name))
	}
	if *idx != "" {
		opts = append(opts, stub.WithPluginIdx(*idx))
	}
	opts = append(opts, stub.WithSocketPath(*socketPath))
	s, err := stub.New(p, opts...)
	if err != nil {
		log.Fatalf("creating the plugin: %v", err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Errorf("plugin ended (%v)", err)
		os.Exit(1)
	}
}

func logTo(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	log.SetOutput(f)
	return nil
}

// dump logs `event: what:`, then msg as YAML, a line at a time.
func dump(event, what string, msgs ...proto.Message) {
	log.Infof("%s: %s:", event, what)
	for _, m := range msgs {
		for _, line := range yamlLines(m) {
			log.Infof("%s:    %s", event, line)
		}
	}
}

func yamlLines(m proto.Message) []string {
	js, err := protojson.Marshal(m)
	if err != nil {
		return []string{"(unprintable: " + err.Error() + ")"}
	}
	var node yaml.Node
	if err := yaml.Unmarshal(js, &node); err != nil {
		return []string{string(js)}
	}
	blockStyle(&node)
	out, err := yaml.Marshal(&node)
	if err != nil {
		return []string{string(js)}
	}
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n")
}

// blockStyle drops the JSON look (flow style, quotes) the nodes were read with.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

func (p *plugin) Configure(_ context.Context, text, runtime, version string) (api.EventMask, error) {
	log.Infof("Connected to %s %s", runtime, version)
	if strings.TrimSpace(text) == "" {
		return p.events, nil
	}
	var cfg config
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return 0, fmt.Errorf("parsing the configuration: %w", err)
	}
	if cfg.LogFile != "" {
		if err := logTo(cfg.LogFile); err != nil {
			return 0, err
		}
	}
	if cfg.SetEnv != "" {
		p.setEnv = cfg.SetEnv
	}
	if len(cfg.Events) > 0 {
		mask, err := api.ParseEventMask(cfg.Events...)
		if err != nil {
			return 0, fmt.Errorf("configured events: %w", err)
		}
		return mask, nil
	}
	return p.events, nil
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	dump("Synchronize", "pods", messages(pods)...)
	dump("Synchronize", "containers", messages(ctrs)...)
	return nil, nil
}

func messages[T proto.Message](list []T) []proto.Message {
	out := make([]proto.Message, len(list))
	for i, m := range list {
		out[i] = m
	}
	return out
}

func (p *plugin) Shutdown(context.Context) {
	log.Info("The runtime is shutting down")
}

func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	dump("RunPodSandbox", "pod", pod)
	return nil
}

func (p *plugin) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, overhead, res *api.LinuxResources) error {
	dump("UpdatePodSandbox", "pod", pod)
	dump("UpdatePodSandbox", "overhead", overhead)
	dump("UpdatePodSandbox", "resources", res)
	return nil
}

func (p *plugin) PostUpdatePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	dump("PostUpdatePodSandbox", "pod", pod)
	return nil
}

func (p *plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	dump("StopPodSandbox", "pod", pod)
	return nil
}

func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	dump("RemovePodSandbox", "pod", pod)
	return nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	dump("CreateContainer", "pod", pod)
	dump("CreateContainer", "container", ctr)
	adjust := &api.ContainerAdjustment{}
	if p.setEnv != "" {
		adjust.AddEnv(p.setEnv, fmt.Sprintf("logger-pid-%d", os.Getpid()))
		dump("CreateContainer", "adjustment", adjust)
	}
	return adjust, nil, nil
}

func (p *plugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	dump("PostCreateContainer", "pod", pod)
	dump("PostCreateContainer", "container", ctr)
	return nil
}

func (p *plugin) StartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	dump("StartContainer", "pod", pod)
	dump("StartContainer", "container", ctr)
	return nil
}

func (p *plugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	dump("PostStartContainer", "pod", pod)
	dump("PostStartContainer", "container", ctr)
	return nil
}

func (p *plugin) UpdateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container, res *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	dump("UpdateContainer", "pod", pod)
	dump("UpdateContainer", "container", ctr)
	dump("UpdateContainer", "resources", res)
	return nil, nil
}

func (p *plugin) PostUpdateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	dump("PostUpdateContainer", "pod", pod)
	dump("PostUpdateContainer", "container", ctr)
	return nil
}

func (p *plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	dump("StopContainer", "pod", pod)
	dump("StopContainer", "container", ctr)
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	dump("RemoveContainer", "pod", pod)
	dump("RemoveContainer", "container", ctr)
	return nil
}

// ValidateContainerAdjustment is told of every container's merged adjustment; it logs it
// and accepts it.
func (p *plugin) ValidateContainerAdjustment(_ context.Context, req *api.ValidateContainerAdjustmentRequest) error {
	dump("ValidateContainerAdjustment", "pod", req.GetPod())
	dump("ValidateContainerAdjustment", "container", req.GetContainer())
	dump("ValidateContainerAdjustment", "adjustment", req.GetAdjust())
	return nil
}
