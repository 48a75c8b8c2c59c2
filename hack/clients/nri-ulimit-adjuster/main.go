// Command nri-ulimit-adjuster is an NRI plugin for crius's tests: it sets a container's
// rlimits from its pod's annotations when the container is created.
//
// The annotation `ulimits.noderesource.dev/container.NAME` (for the container NAME), or
// else `ulimits.noderesource.dev/pod` (for every container of the pod), holds a YAML list:
//
//	# ulimits.noderesource.dev/container.NAME
//	- type: RLIMIT_NOFILE   # or NOFILE, nofile
//	  soft: 1024
//	  hard: 4096
//
// An unknown type, a soft limit above the hard one or a list that does not parse fails the
// container's creation.
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
)

const annotationPrefix = "ulimits.noderesource.dev"

// The rlimits a container can be given (as the OCI runtime spec names them).
var known = map[string]bool{
	"RLIMIT_AS": true, "RLIMIT_CORE": true, "RLIMIT_CPU": true, "RLIMIT_DATA": true,
	"RLIMIT_FSIZE": true, "RLIMIT_LOCKS": true, "RLIMIT_MEMLOCK": true, "RLIMIT_MSGQUEUE": true,
	"RLIMIT_NICE": true, "RLIMIT_NOFILE": true, "RLIMIT_NPROC": true, "RLIMIT_RSS": true,
	"RLIMIT_RTPRIO": true, "RLIMIT_RTTIME": true, "RLIMIT_SIGPENDING": true, "RLIMIT_STACK": true,
}

type rlimit struct {
	Type string `yaml:"type"`
	Soft uint64 `yaml:"soft"`
	Hard uint64 `yaml:"hard"`
}

type plugin struct{}

func main() {
	var (
		name       = flag.String("name", "", "plugin name (default: from the binary's name)")
		idx        = flag.String("idx", "", "plugin index, two digits (default: from the binary's name)")
		socketPath = flag.String("socket-path", api.DefaultSocketPath, "NRI socket to connect to")
	)
	flag.Parse()

	var opts []stub.Option
	if *name != "" {
		opts = append(opts, stub.WithPluginName(*name))
	}
	if *idx != "" {
		opts = append(opts, stub.WithPluginIdx(*idx))
	}
	opts = append(opts, stub.WithSocketPath(*socketPath))
	s, err := stub.New(&plugin{}, opts...)
	if err != nil {
		logrus.Fatalf("creating the plugin: %v", err)
	}
	if err := s.Run(context.Background()); err != nil {
		logrus.Errorf("plugin ended (%v)", err)
		os.Exit(1)
	}
}

// annotation is the container's own annotation under prefix, else the pod-wide one.
func annotation(pod *api.PodSandbox, ctr *api.Container, prefix string) (string, string, bool) {
	for _, key := range []string{prefix + "/container." + ctr.GetName(), prefix + "/pod"} {
		if v, ok := pod.GetAnnotations()[key]; ok {
			return key, v, true
		}
	}
	return "", "", false
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	key, text, ok := annotation(pod, ctr, annotationPrefix)
	if !ok {
		return nil, nil, nil
	}
	var limits []rlimit
	if err := yaml.Unmarshal([]byte(text), &limits); err != nil {
		return nil, nil, fmt.Errorf("annotation %s: %w", key, err)
	}
	adjust := &api.ContainerAdjustment{}
	for _, l := range limits {
		typ := strings.ToUpper(l.Type)
		if !strings.HasPrefix(typ, "RLIMIT_") {
			typ = "RLIMIT_" + typ
		}
		if !known[typ] {
			return nil, nil, fmt.Errorf("annotation %s: unknown rlimit type %q", key, l.Type)
		}
		if l.Soft > l.Hard {
			return nil, nil, fmt.Errorf("annotation %s: %s soft limit %d is above the hard limit %d",
				key, typ, l.Soft, l.Hard)
		}
		logrus.Infof("container %s/%s: %s soft %d hard %d", pod.GetName(), ctr.GetName(), typ, l.Soft, l.Hard)
		adjust.AddRlimit(typ, l.Hard, l.Soft)
	}
	return adjust, nil, nil
}
