//go:build !linux

package moe

func adviseHuge([]byte) {}
