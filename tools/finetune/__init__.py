"""Fine-tuning family: LoRA/QLoRA/full jobs in worker processes; MCP registration in adapter.py."""
