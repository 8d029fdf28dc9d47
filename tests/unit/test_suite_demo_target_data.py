"""The fitted demo target the suite ships (tests/support/demo_target_data.py) is the one today's sample,
fit code and TEST_FIT give; otherwise every session would fit its own, 19 minutes on a loaded CI runner."""

import json

from support import demo_target_data
from support.vllm_server import TEST_DEMO, TEST_FIT


def test_the_shipped_demo_target_is_fitted_from_todays_sample_and_code():
    wanted = demo_target_data.key(TEST_DEMO, TEST_FIT)
    assert demo_target_data.shipped_key() == wanted, (
        f"tests/data/demo-target/ is stale (key {demo_target_data.shipped_key()}, today's {wanted}): "
        f"the demo's sample, fit code or TEST_FIT changed; refit it with `{demo_target_data.REGENERATE}`"
    )
    fit = json.loads((demo_target_data.SHIPPED / "target" / "fit.json").read_text())
    assert fit["steps"] == TEST_FIT.steps and fit["threads"] == TEST_FIT.threads, fit


def test_a_stale_copy_is_not_installed(tmp_path):
    target = tmp_path / "target"
    assert not demo_target_data.install_shipped(target, "not-the-key") and not target.exists()
    assert demo_target_data.install_shipped(target, demo_target_data.shipped_key())
    # installed as the demo's builder writes it: one model.safetensors, the shipped shards' tensors
    from safetensors.torch import load_file

    installed = load_file(target / "model.safetensors")
    shipped = demo_target_data.SHIPPED / "target"
    for shard in shipped.glob("model-*.safetensors"):
        for name, tensor in load_file(shard).items():
            assert installed.pop(name).equal(tensor), name
    assert (
        not installed
        and not list(target.glob("model-*"))
        and not (target / demo_target_data.WEIGHTS_INDEX).exists()
    )


def test_every_shipped_file_is_under_the_repositorys_5_mb_limit():
    sizes = {p.name: p.stat().st_size for p in (demo_target_data.SHIPPED / "target").iterdir()}
    assert max(sizes.values()) < 5_000_000, sizes
