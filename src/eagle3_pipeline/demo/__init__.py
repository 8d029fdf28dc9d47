"""The embedded demo: a bundled sample dataset and a tiny, servable thinking target built offline."""

# demo.family: where each family's target and unit are built (rules/demo.smk) and its unit's template
DEMO_DIRS = {"llama": "resources/demo", "kimi": "resources/demo-kimi"}
DEMO_UNITS = {"llama": "vllm-demo.service", "kimi": "vllm-demo-kimi.service"}
UNIT_TEMPLATES = {
    "llama": "config/demo/vllm-demo.service.in",
    "kimi": "config/demo-kimi/vllm-demo-kimi.service.in",
}


def demo_target_dir(family: str) -> str:
    """The folder rule build_demo_target writes the demo.family's target into."""
    return f"{DEMO_DIRS[family]}/target"
