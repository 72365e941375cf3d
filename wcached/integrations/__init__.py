"""Engine integrations (vLLM first)."""
