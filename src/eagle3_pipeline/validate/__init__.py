"""Validation of an exported EAGLE-3 draft: offline acceptance on held-out hidden states, the draft
served by real vLLM with its spec-decode counters, and the plots of the report."""
