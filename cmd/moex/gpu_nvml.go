//go:build cgo

package main

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// gpuReport lists the NVIDIA GPUs through NVML (loaded with dlopen: no
// driver means a plain sentence, not a failure): name, memory, compute
// capability and active NVLink links with their peers.
func gpuReport() []string {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return []string{fmt.Sprintf("no NVIDIA driver usable here (NVML: %s)", nvml.ErrorString(ret))}
	}
	defer nvml.Shutdown()
	var lines []string
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		lines = append(lines, "driver "+v)
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return append(lines, "cannot count GPUs: "+nvml.ErrorString(ret))
	}
	if n == 0 {
		return append(lines, "no GPU")
	}
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			lines = append(lines, fmt.Sprintf("GPU %d: %s", i, nvml.ErrorString(ret)))
			continue
		}
		name, _ := nvml.DeviceGetName(dev)
		mem, _ := nvml.DeviceGetMemoryInfo(dev)
		major, minor, _ := nvml.DeviceGetCudaComputeCapability(dev)
		links, peers := 0, map[string]bool{}
		for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
			if st, ret := nvml.DeviceGetNvLinkState(dev, l); ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
				links++
				if pci, ret := nvml.DeviceGetNvLinkRemotePciInfo(dev, l); ret == nvml.SUCCESS {
					peers[pciBusID(pci)] = true
				}
			}
		}
		lines = append(lines, fmt.Sprintf("GPU %d: %s, %.1f GiB, compute capability %d.%d, %d NVLink links to %d peers",
			i, name, float64(mem.Total)/(1<<30), major, minor, links, len(peers)))
	}
	return lines
}

func pciBusID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
