"""The embedded demo: a bundled sample dataset and a tiny, servable thinking target built offline."""

DEMO_HIDDEN_SIZE = 128  # the tiny target's hidden size (demo/fit.py); known before the target is built
