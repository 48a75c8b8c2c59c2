// Command nri-device-injector is an NRI plugin for crius's tests: it puts device nodes and
// mounts into a container, as its pod's annotations ask, when the container is created.
//
// `devices.noderesource.dev/container.NAME` (for the container NAME), or else
// `devices.noderesource.dev/pod` (for every container of the pod), holds a YAML list of
// device nodes:
//
//	# devices.noderesource.dev/container.NAME
//	- path: /dev/foo
//	  type: c          # c, b, u or p
//	  major: 1
//	  minor: 11
//	  file_mode: 0600  # optional, as are uid and gid
//	  uid: 0
//	  gid: 0
//
// `mounts.noderesource.dev/container.NAME`, or else `mounts.noderesource.dev/pod`, holds a
// YAML list of mounts:
//
//	# mounts.noderesource.dev/container.NAME
//	- source: /srv/data
//	  destination: /data
//	  type: bind
//	  options: [bind, ro]
//
// An entry without a path (a device) or destination (a mount), or a list that does not
// parse, fails the container's creation.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v3"
)

const (
	devicePrefix = "devices.noderesource.dev"
	mountPrefix  = "mounts.noderesource.dev"
)

type device struct {
	Path     string  `yaml:"path"`
	Type     string  `yaml:"type"`
	Major    int64   `yaml:"major"`
	Minor    int64   `yaml:"minor"`
	FileMode *uint32 `yaml:"file_mode"`
	UID      *uint32 `yaml:"uid"`
	GID      *uint32 `yaml:"gid"`
}

type mount struct {
	Source      string   `yaml:"source"`
	Destination string   `yaml:"destination"`
	Type        string   `yaml:"type"`
	Options     []string `yaml:"options"`
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

// list decodes into out the container's own annotation under prefix, else the pod-wide
// one (if there is either); it returns the annotation's key.
func list(pod *api.PodSandbox, ctr *api.Container, prefix string, out any) (string, error) {
	for _, key := range []string{prefix + "/container." + ctr.GetName(), prefix + "/pod"} {
		if text, ok := pod.GetAnnotations()[key]; ok {
			if err := yaml.Unmarshal([]byte(text), out); err != nil {
				return key, fmt.Errorf("annotation %s: %w", key, err)
			}
			return key, nil
		}
	}
	return "", nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adjust := &api.ContainerAdjustment{}
	who := pod.GetName() + "/" + ctr.GetName()

	var devices []device
	key, err := list(pod, ctr, devicePrefix, &devices)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range devices {
		if d.Path == "" || d.Type == "" {
			return nil, nil, fmt.Errorf("annotation %s: a device needs a path and a type", key)
		}
		dev := &api.LinuxDevice{
			Path:  d.Path,
			Type:  d.Type,
			Major: d.Major,
			Minor: d.Minor,
			Uid:   api.UInt32(d.UID), // nil when not given
			Gid:   api.UInt32(d.GID),
		}
		if d.FileMode != nil {
			dev.FileMode = api.FileMode(*d.FileMode)
		}
		logrus.Infof("container %s: device %s (%s %d:%d)", who, d.Path, d.Type, d.Major, d.Minor)
		adjust.AddDevice(dev)
	}

	var mounts []mount
	key, err = list(pod, ctr, mountPrefix, &mounts)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range mounts {
		if m.Destination == "" {
			return nil, nil, fmt.Errorf("annotation %s: a mount needs a destination", key)
		}
		logrus.Infof("container %s: mount %s on %s (%s %v)", who, m.Source, m.Destination, m.Type, m.Options)
		adjust.AddMount(&api.Mount{
			Source:      m.Source,
			Destination: m.Destination,
			Type:        m.Type,
			Options:     m.Options,
		})
	}

	return adjust, nil, nil
}
