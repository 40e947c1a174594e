package main

// The generator loads package kernels to type-check the stubs it writes.
import _ "github.com/moex-project/moex/kernels"
