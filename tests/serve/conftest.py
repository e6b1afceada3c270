"""The serving tests serve the HF copy of the bundled SmolLM2 that the fine-tuning tests build once per machine."""

from tests.finetune.conftest import hf_base  # noqa: F401  (a shared session fixture)
