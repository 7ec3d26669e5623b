"""The edge router (``kvcompass router``): OpenAI-compatible completions routed by the
routing core's policy over the edge's shared-memory views. See README.md."""
