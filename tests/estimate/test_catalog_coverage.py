"""The catalog covers the GPUs people rent and own (issue #23), each with a public source."""

from __future__ import annotations

import pytest

from gpubox.errors import UnknownNameError
from gpubox.tools.estimate.catalog import package_catalog

RENTED_AND_OWNED = [
    "L40", "A40", "RTX-6000-Ada", "RTX-PRO-6000", "RTX-4080", "RTX-4070-Ti", "RTX-4060-Ti-16GB", "RTX-3080",
    "RTX-3060-12GB", "RTX-A4000", "RTX-A5000", "A6000", "B200", "H20", "GH200", "GH200-144GB", "L4", "T4",
    "V100-16GB", "V100-PCIe-16GB", "A10G", "M1-Max", "M1-Ultra", "M2-Max", "M2-Ultra", "M3-Max", "M3-Ultra", "M4-Max",
]  # fmt: skip


@pytest.mark.parametrize("gpu_id", RENTED_AND_OWNED)
def test_common_gpu_is_in_the_catalog_with_a_source(gpu_id: str) -> None:
    g = package_catalog().gpu(gpu_id)
    assert g.bandwidth_gbs > 0 and g.vram_gb > 0 and g.bf16_tflops > 0 and g.tdp_w > 0
    assert any(s.strip() for s in g.sources.values())


def test_new_entries_cite_a_url() -> None:
    for gpu_id in RENTED_AND_OWNED[:20]:
        g = package_catalog().gpu(gpu_id)
        if gpu_id not in {"A6000", "GH200", "L4", "T4", "V100-16GB", "A10G"}:  # older entries name their datasheet
            assert "https://" in " ".join(g.sources.values()), gpu_id


def test_an_unknown_card_names_close_matches() -> None:
    with pytest.raises(UnknownNameError) as err:
        package_catalog().gpu("RTX 4070 Super")
    assert "RTX-4070-Ti" in str(err.value)
