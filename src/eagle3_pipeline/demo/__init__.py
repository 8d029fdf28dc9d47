"""The embedded demo: a bundled sample dataset and a tiny, servable thinking target built offline."""
