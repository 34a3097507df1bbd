"""Callbacks: monitoring, profiling and training-health hooks. Configs name each class by its
full module path (e.g. `fasttrain.callbacks.perf.PerfMonitor`)."""
