"""From a served vLLM reasoning model to an EAGLE-3 draft it accepts."""
