"""KVCompass load generation: workloads, trace replay, simulator and reports."""
